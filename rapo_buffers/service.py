"""The ``POST /retrieve`` service of a Step-Trace Buffer, with the reference's JSON, micro-batching and ``/health``.

Request and answer follow the reference server::

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": step text, "reward": r, "score": s, "is_final": b}, ...], ...]}

The app is `rapo_tools.search.service.create_search_app` over an
`rapo_buffers.retriever.InProcessRetriever`: concurrent requests are batched into one encode and
one FAISS search, and bad input gets a 4xx. Queries are normalised on the server (drop the system
prompt, keep the last 1,300 characters), so clients may send whole contexts.

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

import json
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
        default_topk: ``topk`` of requests that do not send one (the reference server's ``--topk``).
    """
    if default_topk < 1:
        raise ValueError(f"default_topk must be >= 1, got {default_topk}")

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

    app = create_search_app(
        search_batch,
        route=RETRIEVE_ROUTE,
        limits=limits or DEFAULT_LIMITS,
        batching=batching,
        health_info=health_info,
        title="rapo step-trace retrieval",
        on_shutdown=on_shutdown,
    )
    if default_topk != 3:  # 3 is the request model's own default
        app.add_middleware(_DefaultTopk, topk=default_topk, max_body_bytes=(limits or DEFAULT_LIMITS).max_body_bytes)
    return app


class _DefaultTopk:
    """ASGI middleware: add ``"topk"`` to ``/retrieve`` request bodies that lack it."""

    def __init__(self, app: Any, topk: int, max_body_bytes: int):
        self.app, self.topk, self.max_body_bytes = app, topk, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        length = dict(scope.get("headers", [])).get(b"content-length", b"")
        # Bodies without a length or over the limit are left to the app, which rejects oversized ones unread.
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != RETRIEVE_ROUTE
            or not length.isdigit()
            or int(length) > self.max_body_bytes
        ):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None  # malformed JSON goes through untouched and gets the app's 422
        if isinstance(payload, dict) and "topk" not in payload:
            body = json.dumps({**payload, "topk": self.topk}).encode()
        headers = [(name, value) for name, value in scope["headers"] if name != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()  # after the body: wait for the disconnect as usual
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
