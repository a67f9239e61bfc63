"""An HTTP client of the ``/retrieve`` service that implements the `Retriever` protocol.

Connection failures, 429 and 5xx answers are retried with back-off (by
`rapo_tools.http_client.RetryingClient`); what still fails raises a typed error:
`rapo_tools.base.ServiceUnavailableError` (dead service, malformed answer),
`rapo_tools.base.ToolTimeoutError` or `rapo_tools.base.BadToolInputError` (4xx). The retrieval
wrapper turns any of them into "no retrieval on this step".

Example:
    >>> from rapo_buffers.candidates import Candidate, StaticRetriever
    >>> from rapo_buffers.service import create_retrieval_app
    >>> from rapo_tools.serving import serve_in_thread
    >>> app = create_retrieval_app(StaticRetriever([Candidate("<python>1+1</python>", 1.0, 0.5)]))
    >>> with serve_in_thread(app) as url:
    ...     client = RetrievalClient(url)
    ...     client.retrieve(["q"], topk=1)[0][0].value
    '<python>1+1</python>'
"""

from __future__ import annotations

from typing import Any

from rapo_buffers.candidates import Candidate
from rapo_buffers.service import RETRIEVE_ROUTE
from rapo_tools.aio import on_portal, run_sync
from rapo_tools.base import ServiceUnavailableError
from rapo_tools.http_client import RetryingClient


def parse_retrieve_answer(answer: Any, expected_queries: int) -> list[list[Candidate]]:
    """Turn a ``/retrieve`` JSON answer into candidates.

    Raises:
        ServiceUnavailableError: when the answer does not have the reference shape.
    """
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list) or len(result) != expected_queries:
        raise ServiceUnavailableError(f"malformed /retrieve answer: expected {expected_queries} result lists")
    try:
        return [[Candidate.from_json(item) for item in hits] for hits in result]
    except (TypeError, ValueError) as error:
        raise ServiceUnavailableError(f"malformed /retrieve answer: {error}") from error


class RetrievalClient(RetryingClient):
    """`Retriever` over HTTP: a `RetryingClient` (same arguments: ``base_url``, ``timeout_s``, ``retries``,
    ``backoff_s``, ``max_concurrency``) that speaks ``/retrieve``."""

    async def _retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        answer = await self.post_json(RETRIEVE_ROUTE, {"queries": list(queries), "topk": topk, "return_scores": True})
        return parse_retrieve_answer(answer, len(queries))

    async def aretrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        """Async `retrieve`, awaitable from any event loop."""
        if not queries:
            return []
        return await on_portal(self._retrieve(queries, topk))

    def retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        """For each query, up to ``topk`` candidates, best first (blocking)."""
        if not queries:
            return []
        return run_sync(self._retrieve(queries, topk))

    def health(self) -> dict[str, Any]:
        """The service's ``/health`` answer."""
        return run_sync(self.get_json("/health"))

    def close(self) -> None:
        """Close the connection pool (reopened on next use)."""
        run_sync(self.aclose())


def retriever_from_url(url: str) -> RetrievalClient:
    """The client of the ``/retrieve`` service at ``url`` (``http://host:port``).

    Raises:
        ValueError: for a string that is not an http(s) URL, with the way to build a buffer in-process.
    """
    if not url.startswith(("http://", "https://")):
        raise ValueError(
            f"unknown retriever {url!r}: pass a Retriever object or the http(s) URL of a /retrieve service; "
            "rapo_agents.buffer_build.default_retriever() builds the embedded default buffer in-process"
        )
    return RetrievalClient(url)
