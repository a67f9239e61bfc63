"""Brave Search API: ``web.results[].title/url/description``.

Its snippets carry ``<strong>`` highlights, which `HitLayout.parse` removes.

Example:
    >>> BraveProvider().endpoint
    'https://api.search.brave.com/res/v1/web/search'
    >>> BraveProvider.parse({"web": {"results": [{"title": "A", "url": "u", "description": "<strong>x</strong>"}]}}, 5)
    [SearchResult(title='A', url='u', snippet='x')]
"""

from __future__ import annotations

from rapo_tools.web.providers.base import HitLayout, KeyedApi, KeyedSearchProvider

BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
BRAVE_KEY_ENV = "BRAVE_SEARCH_API_KEY"


class BraveProvider(KeyedSearchProvider):
    """Brave Search; the key goes in ``X-Subscription-Token`` (the arguments: `KeyedSearchProvider`)."""

    name = "brave"
    api = KeyedApi(BRAVE_ENDPOINT, BRAVE_KEY_ENV, key_header="X-Subscription-Token", max_count=20)
    layout = HitLayout(("web", "results"), title="title", url="url", snippet="description")
