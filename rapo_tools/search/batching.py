"""Dynamic micro-batching: many concurrent async requests, one call of a synchronous batch function.

Encoders and FAISS are far faster per item on a batch than one item at a time. A
`MicroBatcher` queues the items of concurrent requests; one worker takes whatever is
queued (up to ``max_batch_size``, waiting at most ``max_wait_s`` for more), runs the
batch function in a worker thread so that the event loop keeps accepting requests,
and hands each caller its own output. While a batch runs, new requests pile up and
form the next batch, so batches grow with load without any tuning.

When a batch call raises, its items are run again one at a time: the item that caused the error gets
it, and the other callers of that batch get their outputs as if they had been alone.

Example:
    >>> import asyncio
    >>> batcher = MicroBatcher(lambda items: [x * x for x in items], max_batch_size=8)
    >>> async def main():
    ...     results = await asyncio.gather(*(batcher.submit(i) for i in range(5)))
    ...     await batcher.aclose()
    ...     return results
    >>> asyncio.run(main())
    [0, 1, 4, 9, 16]
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


class BatcherClosedError(RuntimeError):
    """The batcher was closed while the request waited."""


@dataclasses.dataclass
class BatchStats:
    """Counters of a `MicroBatcher` (exposed by services on ``/health``)."""

    batches: int = 0
    """Batch-function calls made."""
    items: int = 0
    """Items processed over all batches."""
    largest_batch: int = 0
    """Most items in one call."""
    isolated_batches: int = 0
    """Batches that raised and were rerun one item at a time."""
    failed_items: int = 0
    """Items whose own call raised (after isolation)."""

    @property
    def mean_batch_size(self) -> float:
        """Average items per call (0 before the first batch)."""
        return self.items / self.batches if self.batches else 0.0


class MicroBatcher(Generic[InputT, OutputT]):
    """Groups concurrent `submit` calls into calls of ``batch_fn``.

    Args:
        batch_fn: Synchronous function mapping a list of items to a list of outputs of the same
            length, in order. It runs in a dedicated worker thread, one batch at a time.
        max_batch_size: Most items per call.
        max_wait_s: After the first item of a batch arrives, how long to wait for more while
            the queue is empty. Small values keep latency low at light load.
    """

    def __init__(
        self,
        batch_fn: Callable[[list[InputT]], Sequence[OutputT]],
        max_batch_size: int = 64,
        max_wait_s: float = 0.002,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.batch_fn = batch_fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.stats = BatchStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="micro-batch")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[InputT, asyncio.Future[OutputT]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    async def submit(self, item: InputT) -> OutputT:
        """Queue one item and wait for its output; raises what ``batch_fn`` raised for its batch."""
        return (await self.submit_many([item]))[0]

    async def submit_many(self, items: Sequence[InputT]) -> list[OutputT]:
        """Queue several items (e.g. the queries of one request) and wait for all of their outputs."""
        if self._closed:
            raise BatcherClosedError("the micro-batcher is closed")
        loop = asyncio.get_running_loop()
        queue = self._ensure_worker(loop)
        futures: list[asyncio.Future[OutputT]] = []
        for item in items:
            future: asyncio.Future[OutputT] = loop.create_future()
            queue.put_nowait((item, future))
            futures.append(future)
        return list(await asyncio.gather(*futures))

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        # A batcher may outlive one event loop (a server restarted in tests); start afresh on a new loop.
        queue = self._queue
        if queue is None or self._loop is not loop or self._worker is None or self._worker.done():
            queue = asyncio.Queue()
            self._loop, self._queue = loop, queue
            self._worker = loop.create_task(self._work(queue), name="micro-batcher")
        return queue

    async def _collect(self, queue: asyncio.Queue) -> list[tuple[InputT, asyncio.Future[OutputT]]]:
        batch = [await queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _work(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [(item, future) for item, future in await self._collect(queue) if not future.done()]
            if not batch:  # every caller of this batch went away (client disconnected)
                continue
            try:
                outputs = await self._call(loop, [item for item, _ in batch])
            except asyncio.CancelledError:
                _fail(batch, BatcherClosedError("the micro-batcher closed while this request ran"))
                raise
            except Exception as error:  # the worker lives on; the culprit is found by running items alone
                if len(batch) == 1:
                    self.stats.failed_items += 1
                    _fail(batch, error)
                    continue
                self.stats.isolated_batches += 1
                await self._run_one_by_one(loop, batch)
                continue
            for (_, future), output in zip(batch, outputs, strict=True):
                if not future.done():
                    future.set_result(output)

    async def _call(self, loop: asyncio.AbstractEventLoop, items: list[InputT]) -> Sequence[OutputT]:
        outputs = await loop.run_in_executor(self._executor, self.batch_fn, items)
        if len(outputs) != len(items):
            raise RuntimeError(f"the batch function returned {len(outputs)} outputs for {len(items)} items")
        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        return outputs

    async def _run_one_by_one(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[InputT, asyncio.Future[OutputT]]]
    ) -> None:
        for item, future in batch:
            if future.done():
                continue
            try:
                output = (await self._call(loop, [item]))[0]
            except asyncio.CancelledError:
                _fail(batch, BatcherClosedError("the micro-batcher closed while this request ran"))
                raise
            except Exception as error:
                self.stats.failed_items += 1
                if not future.done():
                    future.set_exception(error)
                continue
            if not future.done():
                future.set_result(output)

    async def aclose(self) -> None:
        """Stop the worker, fail requests still queued, and release the worker thread."""
        self._closed = True
        worker, queue = self._worker, self._queue
        self._worker = None
        if worker is not None:
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass
        while queue is not None and not queue.empty():
            _fail([queue.get_nowait()], BatcherClosedError("the micro-batcher closed before this request ran"))
        self._executor.shutdown(wait=False)


def _fail(batch: Sequence[tuple[object, asyncio.Future]], error: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(error)
