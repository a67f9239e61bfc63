"""Bing Web Search API v7 (the reference's provider): ``webPages.value[].name/url/snippet``.

Any service that answers with the same JSON works, e.g. a self-hosted mirror or
the loopback test site of `rapo_tools.web.website`.

Example:
    >>> provider = BingProvider(endpoint="https://api.bing.microsoft.com/v7.0/search", api_key_env="BING_SEARCH_V7_KEY")
    >>> provider.name, provider.endpoint
    ('bing', 'https://api.bing.microsoft.com/v7.0/search')
    >>> BingProvider.parse({"webPages": {"value": [{"name": "T", "url": "u", "snippet": "a &amp; b"}]}}, 10)
    [SearchResult(title='T', url='u', snippet='a & b')]
"""

from __future__ import annotations

from typing import Any

from rapo_tools.web.providers.base import HitLayout, KeyedApi, KeyedSearchProvider

BING_ENDPOINT = "https://api.bing.microsoft.com/v7.0/search"
BING_KEY_ENV = "BING_SEARCH_V7_KEY"


class BingProvider(KeyedSearchProvider):
    """Bing Web Search v7; the key goes in ``Ocp-Apim-Subscription-Key`` (the other arguments: `KeyedSearchProvider`).

    Args:
        market: Bing's ``mkt`` parameter (the reference uses ``en-US``).
    """

    name = "bing"
    api = KeyedApi(BING_ENDPOINT, BING_KEY_ENV, key_header="Ocp-Apim-Subscription-Key", max_count=50)
    layout = HitLayout(("webPages", "value"), title="name", url="url", snippet="snippet")

    def __init__(self, endpoint: str | None = None, api_key_env: str | None = None, *, market: str = "en-US",
                 **options: Any):
        super().__init__(endpoint, api_key_env, **options)
        self.market = market

    def query_params(self, query: str, count: int) -> dict[str, Any]:
        return {"q": query, "count": count, "mkt": self.market, "responseFilter": "Webpages"}
