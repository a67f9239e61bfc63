"""A FastAPI factory for "batched queries -> ranked documents" services (``/wikiSearch``, ``/retrieve``).

Request and response JSON follow the reference servers, so existing clients work unchanged::

    POST {route}  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": ..., "score": 0.83}, ...], ...]}   # one ranked list per query

The ranking itself is a synchronous ``search_batch(queries, topk) -> list[list[dict]]``
whose dicts carry ``"document"`` and ``"score"`` and any extra fields (``"reward"`` for
the step-trace buffer), passed through. Concurrent requests are micro-batched into one
call (one encode, one FAISS search); ``micro_batching=False`` gives the one-call-per-request
baseline. Bad input gets a clear 4xx and never reaches the search function:

- malformed JSON or wrong types: 422; an empty query: 422;
- too many queries, a query too long, a body too large: 413; ``topk`` out of range: 422.

``GET /health`` reports status, batching counters and whatever ``health_info`` returns.

Example:
    >>> import httpx
    >>> from rapo_tools.serving import serve_in_thread
    >>> def search_batch(queries, topk):
    ...     return [[{"document": {"contents": q.upper()}, "score": 1.0}][:topk] for q in queries]
    >>> app = create_search_app(search_batch, route="/wikiSearch")
    >>> with serve_in_thread(app) as url:
    ...     httpx.post(f"{url}/wikiSearch", json={"queries": ["hi"], "topk": 1}).json()
    {'result': [[{'document': {'contents': 'HI'}, 'score': 1.0}]]}
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from rapo_tools.search.batching import MicroBatcher

SearchBatchFn = Callable[[list[str], int], Sequence[Sequence[dict[str, Any]]]]


@dataclasses.dataclass
class ServiceLimits:
    """Input limits of a search service; requests beyond them get a 4xx and do no work."""

    max_queries: int = 256
    """Most queries in one request (413 beyond)."""
    max_query_chars: int = 8_192
    """Longest query in characters (413 beyond)."""
    max_topk: int = 100
    """Largest ``topk`` (422 beyond)."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body in bytes, checked from Content-Length before reading it (413 beyond)."""


@dataclasses.dataclass
class BatchingConfig:
    """Dynamic micro-batching of concurrent requests."""

    enabled: bool = True
    """Group concurrent requests into one search call; False = one call per request (the baseline)."""
    max_batch_size: int = 128
    """Most queries per search call."""
    max_wait_s: float = 0.002
    """How long a batch waits for more queries once the queue is empty."""


class SearchRequest(BaseModel):
    """The reference request body."""

    model_config = ConfigDict(extra="ignore")

    queries: list[StrictStr]
    topk: StrictInt = 3
    return_scores: StrictBool = True


class RequestRejected(Exception):
    """A request broke a `ServiceLimits` rule; carries the HTTP status and message."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def validate_request(request: SearchRequest, limits: ServiceLimits) -> None:
    """Apply `ServiceLimits` to a parsed request; raises `RequestRejected`."""
    if not request.queries:
        raise RequestRejected(422, "'queries' is empty; send at least one query")
    if len(request.queries) > limits.max_queries:
        raise RequestRejected(
            413, f"{len(request.queries)} queries in one request; the limit is {limits.max_queries}, split the request"
        )
    if not 1 <= request.topk <= limits.max_topk:
        raise RequestRejected(422, f"'topk' must be between 1 and {limits.max_topk}, got {request.topk}")
    for position, query in enumerate(request.queries):
        if not query.strip():
            raise RequestRejected(422, f"query {position} is empty")
        if len(query) > limits.max_query_chars:
            raise RequestRejected(
                413, f"query {position} is {len(query)} characters long; the limit is {limits.max_query_chars}"
            )


def _format_results(ranked: Sequence[Sequence[dict[str, Any]]], return_scores: bool) -> list[list[dict[str, Any]]]:
    formatted = []
    for hits in ranked:
        entries = []
        for hit in hits:
            entry = dict(hit)
            if return_scores:
                entry["score"] = float(entry.get("score", 0.0))
            else:
                entry.pop("score", None)
            entries.append(entry)
        formatted.append(entries)
    return formatted


def per_query_topk(search_batch: SearchBatchFn) -> Callable[[list[tuple[str, int]]], list[list[dict[str, Any]]]]:
    """Adapt ``search_batch`` to `MicroBatcher` items ``(query, topk)``.

    Requests grouped in one batch may ask for different ``topk``: search the largest once, cut per query.
    """

    def run_batch(items: list[tuple[str, int]]) -> list[list[dict[str, Any]]]:
        largest = max(topk for _, topk in items)
        ranked = search_batch([query for query, _ in items], largest)
        return [list(hits)[:topk] for hits, (_, topk) in zip(ranked, items, strict=True)]

    return run_batch


def create_search_app(
    search_batch: SearchBatchFn,
    route: str = "/wikiSearch",
    limits: ServiceLimits | None = None,
    batching: BatchingConfig | None = None,
    health_info: Callable[[], dict[str, Any]] | None = None,
    title: str = "rapo search",
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the FastAPI app of a batched ranking service.

    Args:
        search_batch: ``(queries, topk) -> one ranked list of hit dicts per query``; synchronous,
            run off the event loop.
        route: Path of the POST endpoint (``/wikiSearch`` or ``/retrieve``).
        limits: Input limits; defaults to `ServiceLimits()`.
        batching: Micro-batching settings; defaults to `BatchingConfig()`.
        health_info: Extra fields for ``GET /health`` (model, index size, ...).
        title: OpenAPI title.
        on_shutdown: Called once when the server stops (close files, indexes).
    """
    limits = limits or ServiceLimits()
    batching = batching or BatchingConfig()
    run_batch = per_query_topk(search_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.batcher = (
            MicroBatcher(run_batch, max_batch_size=batching.max_batch_size, max_wait_s=batching.max_wait_s)
            if batching.enabled
            else None
        )
        app.state.requests = 0
        app.state.started = time.time()
        try:
            yield
        finally:
            if app.state.batcher is not None:
                await app.state.batcher.aclose()
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(title=title, lifespan=lifespan)

    @app.middleware("http")
    async def limit_body_size(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse(
                {"detail": f"request body is {length} bytes; the limit is {limits.max_body_bytes}"}, status_code=413
            )
        return await call_next(request)

    @app.post(route)
    async def search(body: SearchRequest, request: Request) -> JSONResponse:
        try:
            validate_request(body, limits)
        except RequestRejected as rejected:
            return JSONResponse({"detail": rejected.message}, status_code=rejected.status_code)
        request.app.state.requests += 1
        batcher: MicroBatcher | None = request.app.state.batcher
        try:
            if batcher is not None:
                ranked = await batcher.submit_many([(query, body.topk) for query in body.queries])
            else:
                ranked = await run_in_threadpool(run_batch, [(query, body.topk) for query in body.queries])
        except Exception as error:  # report, don't crash the server; clients retry 5xx
            return JSONResponse({"detail": f"search failed: {type(error).__name__}: {error}"}, status_code=500)
        # JSONResponse directly: FastAPI's generic encoder is slow on large nested results.
        return JSONResponse({"result": _format_results(ranked, body.return_scores)})

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        batcher: MicroBatcher | None = request.app.state.batcher
        stats = batcher.stats if batcher is not None else None
        return {
            "status": "ok",
            "route": route,
            "requests": request.app.state.requests,
            "micro_batching": batching.enabled,
            "batches": stats.batches if stats else None,
            "mean_batch_size": round(stats.mean_batch_size, 2) if stats else None,
            "largest_batch": stats.largest_batch if stats else None,
            "uptime_s": round(time.time() - request.app.state.started, 1),
            **(health_info() if health_info is not None else {}),
        }

    return app
