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
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr
from starlette.types import ASGIApp, Receive, Scope, Send

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
    intra_op_threads: int | None = 1
    """Torch intra-op threads of each thread that runs the search function (both modes); None keeps torch's
    setting. One by default: on a busy machine every multi-threaded op waits until all of its OpenMP threads
    get a core (a single-query encode measured 470 ms instead of 14 ms on 2 shared cores; a micro-batched
    server at 64 clients fell from 131 to 18 queries/s with 2 threads), and the event loop needs the other
    core to parse requests while a batch is encoded. On a quiet machine the other way round: one thread per core
    took the micro-batched server from 125 to 199 queries/s at 64 clients, while one-query encodes barely gain."""


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


class BodySizeLimit:
    """ASGI middleware answering 413, before the body is read, when Content-Length exceeds ``max_body_bytes``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_body_bytes:
                response = JSONResponse(
                    {"detail": f"request body is {int(length)} bytes; the limit is {self.max_body_bytes}"},
                    status_code=413,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


class IntraOpThreadLimit:
    """Sets torch's intra-op thread count of the calling thread, once per thread.

    Torch keeps the count per OS thread, so each worker thread (the micro-batcher's, or the
    thread pool's in per-request mode) must set it itself. Threads that already ran torch keep
    their count (the main thread of a trainer hosting the service in-process), but threads that
    start later in the process default to it. ``threads=None`` does nothing. Picklable (Ray Serve
    ships the app to its replicas): the per-thread record starts afresh on unpickling.
    """

    def __init__(self, threads: int | None):
        if threads is not None and threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1 or None, got {threads}")
        self.threads = threads
        self._configured = threading.local()

    def __call__(self) -> None:
        if self.threads is None or getattr(self._configured, "done", False):
            return
        import torch

        torch.set_num_threads(self.threads)
        self._configured.done = True

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"])


def per_query_topk(
    search_batch: SearchBatchFn, prepare_thread: Callable[[], None] | None = None
) -> Callable[[list[tuple[str, int]]], list[list[dict[str, Any]]]]:
    """Adapt ``search_batch`` to `MicroBatcher` items ``(query, topk)``.

    Requests grouped in one batch may ask for different ``topk``: search the largest once, cut per query.
    ``prepare_thread`` runs first in the calling thread (see `IntraOpThreadLimit`).
    """

    def run_batch(items: list[tuple[str, int]]) -> list[list[dict[str, Any]]]:
        if prepare_thread is not None:
            prepare_thread()
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
    run_batch = per_query_topk(search_batch, IntraOpThreadLimit(batching.intra_op_threads))

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
    # A plain ASGI middleware: ``@app.middleware("http")`` runs every request through extra tasks and
    # streams, which cost the event loop more than the whole request under load.
    app.add_middleware(BodySizeLimit, max_body_bytes=limits.max_body_bytes)

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
