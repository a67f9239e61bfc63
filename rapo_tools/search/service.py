"""A FastAPI factory for "batched queries -> ranked documents" services (``/wikiSearch``, ``/retrieve``).

Request and response JSON follow the reference servers, so existing clients work unchanged::

    POST {route}  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": ..., "score": 0.83}, ...], ...]}   # one ranked list per query

The ranking itself is a synchronous ``search_batch(queries, topk) -> list[list[dict]]``
whose dicts carry ``"document"`` and ``"score"`` and any extra fields (``"reward"`` for
the step-trace buffer), passed through. A service may offer several renderings of the document
(``document_formats``; ``/wikiSearch``: the reference's ``contents`` string by default, the whole
passage object on request). Concurrent requests are micro-batched into one call (one encode, one
FAISS search); ``micro_batching=False`` gives the one-call-per-request baseline.

Bad input gets a clear 4xx before it joins a batch (see `rapo_tools.search.wire`), and should a batch
still fail, its queries are retried one by one so that only the culprit's request fails. Answers are
serialised by orjson. ``GET /health`` reports status, batching counters and whatever ``health_info`` returns.

Example:
    >>> import httpx
    >>> from rapo_tools.serving import serve_in_thread
    >>> def search_batch(queries, topk):
    ...     return [[{"document": {"contents": q.upper()}, "score": 1.0}][:topk] for q in queries]
    >>> app = create_search_app(search_batch, route="/wikiSearch")
    >>> with serve_in_thread(app) as url:
    ...     httpx.post(f"{url}/wikiSearch", json={"queries": ["hi"], "topk": 1}, timeout=60).json()
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
from fastapi.responses import Response

from rapo_tools.search.batching import MicroBatcher
from rapo_tools.search.wire import (
    DocumentFormats,
    RequestRejected,
    SearchRequest,
    ServiceLimits,
    json_response,
    parse_request,
    read_body,
    render_answer,
)

SearchBatchFn = Callable[[list[str], int], Sequence[Sequence[dict[str, Any]]]]


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
    default_topk: int = 3,
    document_formats: DocumentFormats | None = None,
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
        default_topk: ``topk`` of requests that send none, null or 0 (the reference servers' ``--topk``).
        document_formats: Renderings of a hit's ``document`` that a request may pick with
            ``"document_format"``; the first is the default. None: documents go out as ``search_batch`` made them.
    """
    limits = limits or ServiceLimits()
    batching = batching or BatchingConfig()
    if not 1 <= default_topk <= limits.max_topk:
        raise ValueError(f"default_topk must be between 1 and {limits.max_topk}, got {default_topk}")
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
    # The body is read and parsed by hand (counted bytes, strict JSON): tell OpenAPI what it holds.
    request_schema = {"requestBody": {"content": {"application/json": {"schema": SearchRequest.model_json_schema()}}}}

    @app.post(route, openapi_extra=request_schema)
    async def search(request: Request) -> Response:
        try:
            body = parse_request(await read_body(request, limits), limits, default_topk, document_formats)
        except RequestRejected as rejected:
            return rejected.response()
        request.app.state.requests += 1
        if not body.queries:
            return json_response({"result": []})
        items = [(query, body.topk) for query in body.queries]
        batcher: MicroBatcher | None = request.app.state.batcher
        try:
            if batcher is not None:
                ranked = await batcher.submit_many(items)
            else:
                ranked = await run_in_threadpool(run_batch, items)
        except Exception as error:  # report, don't crash the server; clients retry 5xx
            return json_response({"detail": f"search failed: {type(error).__name__}: {error}"}, 500)
        return render_answer(ranked, body, document_formats)

    @app.get("/health")
    async def health(request: Request) -> Response:
        batcher: MicroBatcher | None = request.app.state.batcher
        stats = batcher.stats if batcher is not None else None
        return json_response(
            {
                "status": "ok",
                "route": route,
                "requests": request.app.state.requests,
                "micro_batching": batching.enabled,
                "batches": stats.batches if stats else None,
                "mean_batch_size": round(stats.mean_batch_size, 2) if stats else None,
                "largest_batch": stats.largest_batch if stats else None,
                "isolated_batches": stats.isolated_batches if stats else None,
                "default_topk": default_topk,
                "uptime_s": round(time.time() - request.app.state.started, 1),
                **(health_info() if health_info is not None else {}),
            }
        )

    return app
