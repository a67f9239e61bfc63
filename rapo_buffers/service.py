"""The ``POST /retrieve`` service of a Step-Trace Buffer, with the reference's JSON, micro-batching and ``/health``.

Request and answer follow the reference server::

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": step text, "reward": r, "score": s, "is_final": b}, ...], ...]}

The app is `rapo_tools.search.service.create_search_app` over an
`rapo_buffers.retriever.InProcessRetriever`: concurrent requests are batched into one encode and
one FAISS search, and bad input gets a 4xx. Queries are normalised on the server (drop the system
prompt, keep the last 1,300 characters), so clients may send whole contexts. The reply is the
reference's, which its ``RetrieveTool`` parses (the best ``reward``'s ``document``), plus ``is_final``.

Example:
    >>> import httpx
    >>> from rapo_buffers.candidates import Candidate, StaticRetriever
    >>> from rapo_tools.serving import serve_in_thread
    >>> app = create_retrieval_app(StaticRetriever([Candidate("<python>1+1</python>", 1.0, 0.5)]))
    >>> with serve_in_thread(app) as url:
    ...     httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 1}).json()["result"][0][0]["reward"]
    1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from rapo_buffers.candidates import Retriever
from rapo_tools.search.service import BatchingConfig, ServiceLimits, create_search_app

RETRIEVE_ROUTE = "/retrieve"
# Queries are whole episode contexts that the server cuts to 1,300 characters itself.
DEFAULT_LIMITS = ServiceLimits(max_query_chars=262_144)


def create_retrieval_app(
    retriever: Retriever,
    limits: ServiceLimits | None = None,
    batching: BatchingConfig | None = None,
    health_info: Callable[[], dict[str, Any]] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    default_topk: int = 3,
) -> FastAPI:
    """Build the ``/retrieve`` app over ``retriever`` (any `Retriever`; normally an `InProcessRetriever`).

    Args:
        retriever: Ranks step traces for a batch of queries.
        limits: Input limits; defaults to 256 queries per request of at most 262,144 characters each.
        batching: Micro-batching settings; ``BatchingConfig(enabled=False)`` is the per-request baseline.
        health_info: Extra ``/health`` fields (buffer size, model).
        on_shutdown: Called when the server stops.
        default_topk: ``topk`` of requests that send none, null or 0 (the reference server's ``--topk``).
    """

    def search_batch(queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        return [
            [
                {
                    "document": candidate.value,
                    "reward": candidate.reward,
                    "score": candidate.score,
                    "is_final": candidate.is_final,
                }
                for candidate in candidates
            ]
            for candidates in retriever.retrieve(queries, topk)
        ]

    return create_search_app(
        search_batch,
        route=RETRIEVE_ROUTE,
        limits=limits or DEFAULT_LIMITS,
        batching=batching,
        health_info=health_info,
        title="rapo step-trace retrieval",
        on_shutdown=on_shutdown,
        default_topk=default_topk,
    )
