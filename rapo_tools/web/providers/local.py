"""Search a local corpus with rapo's own dense index (`rapo_tools.search.wiki_search.WikiSearch`).

The offline default of ``RAPO-Web-v0``: the passages of the procedural knowledge base
are the pages of a site served on loopback (`rapo_tools.web.website`), one page per
passage at ``/wiki/<slug of its title>``; a query returns the closest pages as
normalised results whose URLs ``<browse>`` can open.

Example:
    >>> from rapo_tools.search.corpus import Passage
    >>> from rapo_tools.search.wiki_search import WikiSearch
    >>> wiki = WikiSearch.from_passages([Passage("0", "Paris", "Paris is the capital of France."),
    ...                                  Passage("1", "Nile", "The Nile is a river in Africa.")])
    >>> provider = LocalProvider(wiki, url_prefix="http://127.0.0.1:8000")
    >>> from rapo_tools.aio import run_sync
    >>> run_sync(provider.search("French capital city", 1))[0].url
    'http://127.0.0.1:8000/wiki/paris'
"""

from __future__ import annotations

import asyncio
import re

from rapo_tools.search.wiki_search import WikiSearch
from rapo_tools.web.providers.base import SearchProvider
from rapo_tools.web.results import SearchResult


def slugify(title: str) -> str:
    """The URL path segment of a page titled ``title``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "page"


def page_path(title: str) -> str:
    """Where the page of the passage titled ``title`` lives on the local site."""
    return f"/wiki/{slugify(title)}"


class LocalProvider(SearchProvider):
    """Dense search over a `WikiSearch` index, answering with site URLs.

    Args:
        wiki: The in-process index and its passages.
        url_prefix: The local site's base URL, joined in front of each page path.
        snippet_chars: Length of the snippet cut from each passage.
    """

    name = "local"

    def __init__(self, wiki: WikiSearch, url_prefix: str = "", snippet_chars: int = 300):
        if snippet_chars < 1:
            raise ValueError(f"snippet_chars must be >= 1, got {snippet_chars}")
        self.wiki = wiki
        self.url_prefix = url_prefix.rstrip("/")
        self.snippet_chars = snippet_chars
        self.endpoint = f"local:{len(wiki)}:{self.url_prefix}"

    def with_url_prefix(self, url_prefix: str) -> LocalProvider:
        """The same index with URLs under ``url_prefix`` (nothing is re-embedded)."""
        return LocalProvider(self.wiki, url_prefix, self.snippet_chars)

    def search_sync(self, query: str, top_k: int) -> list[SearchResult]:
        """Blocking search (the async `search` runs it in a worker thread)."""
        results = []
        for hit in self.wiki.search([query], topk=top_k)[0]:
            snippet = " ".join(hit.passage.text.split())
            if len(snippet) > self.snippet_chars:
                snippet = snippet[: self.snippet_chars].rsplit(" ", 1)[0] + " ..."
            url = f"{self.url_prefix}{page_path(hit.passage.title)}"
            results.append(SearchResult(title=hit.passage.title, url=url, snippet=snippet))
        return results

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        # Encoding is CPU-bound; keep the portal loop free for other episodes' tool calls.
        return await asyncio.to_thread(self.search_sync, query, top_k)
