"""Search a local corpus of web pages with rapo's own dense index (MiniLM embeddings + FAISS).

The offline default of ``RAPO-Web-v0``: the pages of a generated site (served on
loopback by `rapo_tools.web.website`) are embedded once; a query returns the closest
pages as normalised results, with the page's URL so that ``<browse>`` can open it.

Example:
    >>> docs = [WebDocument("Paris", "/wiki/paris", "Paris is the capital of France."),
    ...         WebDocument("Nile", "/wiki/nile", "The Nile is a river in Africa.")]
    >>> provider = LocalProvider(docs, url_prefix="http://127.0.0.1:8000")
    >>> from rapo_tools.aio import run_sync
    >>> run_sync(provider.search("French capital city", 1))[0].url
    'http://127.0.0.1:8000/wiki/paris'
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from rapo_tools.search.embedding import Embedder
from rapo_tools.search.faiss_index import IndexConfig, build_index
from rapo_tools.web.providers.base import SearchProvider
from rapo_tools.web.results import SearchResult


@dataclasses.dataclass(frozen=True)
class WebDocument:
    """One page of a local corpus."""

    title: str
    """The page title."""
    url: str
    """Its address; relative paths are joined to the provider's ``url_prefix``."""
    text: str
    """The page's text (embedded for search, and cut into the snippet)."""


@dataclasses.dataclass
class _SharedIndex:
    documents: list[WebDocument]
    embedder: Embedder
    index: Any


class LocalProvider(SearchProvider):
    """Dense search over ``documents``.

    Args:
        documents: The pages.
        embedder: The sentence encoder (default: the embedded all-MiniLM-L6-v2).
        url_prefix: Joined in front of relative document URLs (the loopback site's base URL).
        snippet_chars: Length of the snippet cut from each page's text.
        index_config: FAISS index settings (default: exact inner product, right for small corpora).
    """

    name = "local"

    def __init__(
        self,
        documents: Sequence[WebDocument],
        embedder: Embedder | None = None,
        url_prefix: str = "",
        snippet_chars: int = 300,
        index_config: IndexConfig | None = None,
    ):
        if not documents:
            raise ValueError("the local search provider needs at least one document")
        embedder = embedder or Embedder()
        vectors = embedder.encode([f"{doc.title}\n{doc.text}" for doc in documents])
        index = build_index(vectors, index_config or IndexConfig(kind="flat"), show_progress=False)
        self._shared = _SharedIndex(list(documents), embedder, index)
        self.url_prefix = url_prefix.rstrip("/")
        self.snippet_chars = snippet_chars
        self.endpoint = f"local:{len(documents)}:{self.url_prefix}"

    def with_url_prefix(self, url_prefix: str) -> LocalProvider:
        """The same corpus and index, with URLs under ``url_prefix`` (no re-embedding)."""
        clone = object.__new__(LocalProvider)
        clone._shared = self._shared
        clone.url_prefix = url_prefix.rstrip("/")
        clone.snippet_chars = self.snippet_chars
        clone.endpoint = f"local:{len(self._shared.documents)}:{clone.url_prefix}"
        return clone

    @property
    def documents(self) -> list[WebDocument]:
        return self._shared.documents

    def search_sync(self, query: str, top_k: int) -> list[SearchResult]:
        """Blocking search (the async `search` runs it in a worker thread)."""
        shared = self._shared
        vectors = shared.embedder.encode([query])
        _, ids = shared.index.search(vectors, min(top_k, len(shared.documents)))
        results = []
        for doc_id in ids[0]:
            if doc_id < 0:
                continue
            doc = shared.documents[int(doc_id)]
            url = doc.url if "://" in doc.url else f"{self.url_prefix}{doc.url}"
            snippet = " ".join(doc.text.split())
            if len(snippet) > self.snippet_chars:
                snippet = snippet[: self.snippet_chars].rsplit(" ", 1)[0] + " ..."
            results.append(SearchResult(title=doc.title, url=url, snippet=snippet))
        return results

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        # Encoding is CPU-bound; keep the portal loop free for other episodes' tool calls.
        return await asyncio.to_thread(self.search_sync, query, top_k)
