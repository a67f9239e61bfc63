"""Brave Search API: ``web.results[].title/url/description``.

Example:
    >>> BraveProvider().endpoint
    'https://api.search.brave.com/res/v1/web/search'
"""

from __future__ import annotations

from typing import Any

from rapo_tools.base import ServiceUnavailableError
from rapo_tools.web.providers.base import KeyedJsonApi, SearchProvider
from rapo_tools.web.results import SearchResult, clean_text

BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
BRAVE_KEY_ENV = "BRAVE_SEARCH_API_KEY"
_BRAVE_MAX_COUNT = 20  # the API's largest page


def parse_brave(payload: Any, top_k: int) -> list[SearchResult]:
    """Normalise a Brave answer (its snippets carry ``<strong>`` highlights, which are removed)."""
    if not isinstance(payload, dict):
        raise ServiceUnavailableError(f"the Brave endpoint answered {type(payload).__name__}, not a JSON object")
    web = payload.get("web") or {}
    values = web.get("results") if isinstance(web, dict) else None
    if not isinstance(values, list):
        return []
    results = [
        SearchResult(
            title=clean_text(item.get("title")),
            url=str(item.get("url") or ""),
            snippet=clean_text(item.get("description")),
        )
        for item in values
        if isinstance(item, dict)
    ]
    return results[:top_k]


class BraveProvider(SearchProvider):
    """Brave Search.

    Args:
        endpoint: The web-search URL.
        api_key_env: Environment variable holding the key, sent as ``X-Subscription-Token``.
        timeout_s, retries, backoff_s: Per-attempt time limit and retry policy on 429/5xx.
    """

    name = "brave"

    def __init__(
        self,
        endpoint: str = BRAVE_ENDPOINT,
        api_key_env: str = BRAVE_KEY_ENV,
        timeout_s: float = 20.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ):
        self.endpoint = endpoint
        self._api = KeyedJsonApi(endpoint, "X-Subscription-Token", api_key_env, "brave", timeout_s, retries, backoff_s)

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        payload = await self._api.get({"q": query, "count": min(top_k, _BRAVE_MAX_COUNT)})
        return parse_brave(payload, top_k)

    async def aclose(self) -> None:
        await self._api.aclose()
