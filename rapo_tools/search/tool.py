"""The ``<search>`` tool: the model's query -> the top passages, in the reference observation format.

Two backends behind one interface (``async search(queries, topk) -> ranked hit dicts``):

- `InProcessSearchBackend`: a `WikiSearch` in this process; concurrent calls from many
  episodes are micro-batched into one encode + one FAISS search, run off the event loop.
- `HttpSearchBackend`: a running ``/wikiSearch`` service (``rapo search serve``), through
  `RetryingClient` (timeouts, retries with back-off, typed errors).

A dead or slow service never raises out of the tool: the result is not ok, its text says
that the search failed, and ``ToolResult.error`` names the kind (``timeout``,
``service_unavailable``) so that the environment can count it.

The default observation follows the reference: ``Doc 1 (Title: ...)\\n text`` for the top 3.

Example:
    >>> from rapo_tools.search.corpus import Passage
    >>> from rapo_tools.search.wiki_search import WikiSearch
    >>> wiki = WikiSearch.from_passages([Passage("0", "Paris", "Paris is the capital of France."),
    ...                                  Passage("1", "Oslo", "Oslo is the capital of Norway.")])
    >>> tool = SearchTool(wiki, SearchToolConfig(topk=1))
    >>> print(tool.call("capital of Norway").text)
    Doc 1 (Title: Oslo)
    Oslo is the capital of Norway.
    >>> tool.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Literal, Protocol

from rapo_tools.aio import run_sync
from rapo_tools.base import (
    EMPTY_CALL,
    BadToolInputError,
    ServiceUnavailableError,
    Tool,
    ToolResult,
    ToolTimeoutError,
)
from rapo_tools.http_client import RetryingClient
from rapo_tools.search.batching import MicroBatcher
from rapo_tools.search.service import per_query_topk
from rapo_tools.search.wiki_search import WikiSearch
from rapo_tools.search.wire import query_problem


@dataclasses.dataclass
class SearchToolConfig:
    """How the ``<search>`` tool queries and what it shows the model."""

    topk: int = 3
    """Passages shown per query (the reference shows 3)."""
    doc_template: str = "Doc {rank} (Title: {title})\n{text}"
    """Format of one passage; fields: ``rank`` (from 1), ``title``, ``text``, ``score``, ``id``."""
    separator: str = "\n"
    """Between two formatted passages."""
    max_doc_chars: int = 2_000
    """Cut each passage's text to this many characters (long KILT pages would flood the context)."""
    max_query_chars: int = 1_000
    """Longer queries are rejected with a failed result (a model looping inside <search>)."""
    timeout_s: float = 10.0
    """Time limit of one search (per HTTP attempt for the service backend)."""
    retries: int = 2
    """Retries of a failed service call (connection errors, 429, 5xx)."""
    backoff_s: float = 0.2
    """First retry delay; doubles each retry."""
    max_concurrency: int = 64
    """Service backend: requests in flight at once."""
    route: str = "/wikiSearch"
    """Service backend: the search endpoint's path."""
    max_batch_size: int = 64
    """In-process backend: most queries per micro-batch."""
    output: Literal["paper", "reference"] = "paper"
    """``reference``: the reference's ``WikiSearchTool`` byte for byte (`format_hits_reference`: its
    layout, no passage cap, ignoring ``doc_template``/``separator``/``max_doc_chars``), and an empty
    ``<search></search>`` ends the episode as in the reference's rollout (``error`` is `EMPTY_CALL`)."""

    def __post_init__(self) -> None:
        if self.output not in ("paper", "reference"):
            raise ValueError(f"SearchToolConfig.output must be 'paper' or 'reference', got {self.output!r}")
        if self.topk < 1:
            raise ValueError(f"SearchToolConfig.topk must be >= 1, got {self.topk}")
        if self.timeout_s <= 0:
            raise ValueError(f"SearchToolConfig.timeout_s must be positive, got {self.timeout_s}")


class SearchBackend(Protocol):
    """Anything that ranks documents for a batch of queries in the reference hit format."""

    async def search(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        """One ranked list of ``{"document": {...}, "score": float}`` per query."""

    async def aclose(self) -> None:
        """Release connections, threads, files."""


class InProcessSearchBackend:
    """Searches a `WikiSearch` in this process, micro-batching concurrent calls."""

    def __init__(self, wiki: WikiSearch, timeout_s: float = 10.0, max_batch_size: int = 64):
        self.wiki = wiki
        self.timeout_s = timeout_s
        self._batcher = MicroBatcher(per_query_topk(wiki.search_results), max_batch_size=max_batch_size)

    async def search(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        try:
            return await asyncio.wait_for(
                self._batcher.submit_many([(query, topk) for query in queries]), self.timeout_s
            )
        except asyncio.TimeoutError as error:
            raise ToolTimeoutError(f"the search index did not answer within {self.timeout_s:g} s") from error

    async def aclose(self) -> None:
        await self._batcher.aclose()


class HttpSearchBackend:
    """Queries a ``/wikiSearch`` service with the reference JSON."""

    def __init__(self, base_url: str, config: SearchToolConfig | None = None):
        config = config or SearchToolConfig()
        self.route = config.route
        self.client = RetryingClient(
            base_url,
            timeout_s=config.timeout_s,
            retries=config.retries,
            backoff_s=config.backoff_s,
            max_concurrency=config.max_concurrency,
        )

    async def search(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        # rapo's servers send whole passage objects on request (ids for the template); the reference's
        # ignore the field and send contents strings, which `format_hits` reads as well.
        payload = {"queries": queries, "topk": topk, "return_scores": True, "document_format": "object"}
        answer = await self.client.post_json(self.route, payload)
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or len(result) != len(queries) or not all(isinstance(r, list) for r in result):
            raise ServiceUnavailableError(
                f"{self.client.base_url}{self.route} answered without a 'result' list per query"
            )
        return result

    async def aclose(self) -> None:
        await self.client.aclose()


def _title_and_text(document: Any) -> tuple[str, str, str]:
    """(id, title, text) of a hit's document: our dicts, Search-R1's ``contents`` dicts, or a bare string."""
    if isinstance(document, str):
        title, _, text = document.partition("\n")
        return "", title.strip().strip('"'), text.strip()
    if not isinstance(document, dict):
        return "", "", str(document)
    identifier = str(document.get("id", ""))
    if "title" in document and "text" in document:
        return identifier, str(document["title"]), str(document["text"])
    title, _, text = str(document.get("contents", "")).partition("\n")
    return identifier, title.strip().strip('"'), text.strip()


def format_hits(hits: list[dict[str, Any]], config: SearchToolConfig) -> str:
    """Render ranked hits as the model's observation."""
    if not hits:
        return "No results found."
    rendered = []
    for rank, hit in enumerate(hits, start=1):
        identifier, title, text = _title_and_text(hit.get("document"))
        if len(text) > config.max_doc_chars:
            text = text[: config.max_doc_chars].rstrip() + " ..."
        rendered.append(
            config.doc_template.format(rank=rank, title=title, text=text, score=hit.get("score", 0.0), id=identifier)
        )
    return config.separator.join(rendered)


def _reference_contents(document: Any) -> str:
    """The wiki-18 ``contents`` string (``"Title"\\ntext``) the reference's tool reads from a hit's document."""
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        return str(document)
    if "contents" in document:
        return str(document["contents"])
    return f'"{document.get("title", "")}"\n{document.get("text", "")}'


def format_hits_reference(hits: list[dict[str, Any]]) -> str:
    """The reference ``WikiSearchTool``'s text for one query's hits (``_passages2string``), byte for byte.

    Each passage is ``Doc i (Title: <first line of contents>)`` then the rest of its contents and a
    blank line, the whole stripped: the wiki-18 title keeps its quotes, and nothing is cut.

    Example:
        >>> print(format_hits_reference([{"document": '"Paris"\\nParis is the capital.'},
        ...                              {"document": {"title": "Oslo", "text": "Oslo."}}]))
        Doc 1 (Title: "Paris")
        Paris is the capital.
        <BLANKLINE>
        Doc 2 (Title: "Oslo")
        Oslo.
    """
    rendered = ""
    for rank, hit in enumerate(hits, start=1):
        title, _, text = _reference_contents(hit.get("document")).partition("\n")
        rendered += f"Doc {rank} (Title: {title})\n{text}\n\n"
    return rendered.strip()


class SearchTool(Tool):
    """``<search> query </search>``: shows the top passages of a local knowledge index.

    Args:
        backend: A `WikiSearch` (searched in-process), a service URL (``"http://host:port"``),
            or any `SearchBackend`.
        config: Formatting, limits, timeouts and retries.
    """

    name = "search"

    def __init__(self, backend: WikiSearch | str | SearchBackend, config: SearchToolConfig | None = None):
        self.config = config or SearchToolConfig()
        if isinstance(backend, WikiSearch):
            backend = InProcessSearchBackend(backend, self.config.timeout_s, self.config.max_batch_size)
        elif isinstance(backend, str):
            backend = HttpSearchBackend(backend, self.config)
        self.backend: SearchBackend | None = backend

    @property
    def reference_output(self) -> bool:
        return self.config.output == "reference"

    async def _execute(self, argument: str) -> ToolResult:
        reference = self.config.output == "reference"
        query = argument.strip() if reference else " ".join(argument.split())
        if not query:
            if reference:  # the reference's rollout stops at an empty call
                return ToolResult(text="", ok=False, error=EMPTY_CALL)
            raise BadToolInputError("the <search> block is empty; put a query between <search> and </search>")
        # Checked before the query joins a batch shared with other episodes' queries.
        problem = query_problem(query, self.config.max_query_chars)
        if problem is not None:
            raise BadToolInputError(f"the query {problem[1]}")
        if self.backend is None:
            raise ServiceUnavailableError("the search tool is closed")
        hits = (await self.backend.search([query], self.config.topk))[0]
        text = format_hits_reference(hits) if reference else format_hits(hits, self.config)
        return ToolResult(text=text, ok=True)

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            run_sync(backend.aclose())
