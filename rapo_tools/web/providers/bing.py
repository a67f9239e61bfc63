"""Bing Web Search API v7 (the reference's provider): ``webPages.value[].name/url/snippet``.

Any service that answers with the same JSON works, e.g. a self-hosted mirror or
the loopback test site of `rapo_tools.web.website`.

Example:
    >>> provider = BingProvider(endpoint="https://api.bing.microsoft.com/v7.0/search", api_key_env="BING_SEARCH_V7_KEY")
    >>> provider.name, provider.endpoint
    ('bing', 'https://api.bing.microsoft.com/v7.0/search')
"""

from __future__ import annotations

from typing import Any

from rapo_tools.base import ServiceUnavailableError
from rapo_tools.web.providers.base import KeyedJsonApi, SearchProvider
from rapo_tools.web.results import SearchResult, clean_text

BING_ENDPOINT = "https://api.bing.microsoft.com/v7.0/search"
BING_KEY_ENV = "BING_SEARCH_V7_KEY"
_BING_MAX_COUNT = 50  # the API's largest page


def parse_bing(payload: Any, top_k: int) -> list[SearchResult]:
    """Normalise a Bing v7 answer; an answer without ``webPages`` means no results."""
    if not isinstance(payload, dict):
        raise ServiceUnavailableError(f"the Bing endpoint answered {type(payload).__name__}, not a JSON object")
    pages = payload.get("webPages") or {}
    values = pages.get("value") if isinstance(pages, dict) else None
    if not isinstance(values, list):
        return []
    results = []
    for item in values:
        if not isinstance(item, dict):
            continue
        results.append(
            SearchResult(
                title=clean_text(item.get("name")),
                url=str(item.get("url") or ""),
                snippet=clean_text(item.get("snippet")),
            )
        )
    return results[:top_k]


class BingProvider(SearchProvider):
    """Bing Web Search v7.

    Args:
        endpoint: The search URL (Azure's, or a compatible mirror).
        api_key_env: Environment variable holding the key, sent as ``Ocp-Apim-Subscription-Key``.
        market: Bing's ``mkt`` parameter (the reference uses ``en-US``).
        timeout_s, retries, backoff_s: Per-attempt time limit and retry policy on 429/5xx.
    """

    name = "bing"

    def __init__(
        self,
        endpoint: str = BING_ENDPOINT,
        api_key_env: str = BING_KEY_ENV,
        market: str = "en-US",
        timeout_s: float = 20.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ):
        self.endpoint = endpoint
        self.market = market
        self._api = KeyedJsonApi(
            endpoint, "Ocp-Apim-Subscription-Key", api_key_env, "bing", timeout_s, retries, backoff_s
        )

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        payload = await self._api.get(
            {"q": query, "count": min(top_k, _BING_MAX_COUNT), "mkt": self.market, "responseFilter": "Webpages"}
        )
        return parse_bing(payload, top_k)

    async def aclose(self) -> None:
        await self._api.aclose()
