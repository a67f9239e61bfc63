"""MicroBatcher: concurrent requests become few batch calls, results stay matched, errors stay contained."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rapo_tools.search.batching import BatcherClosedError, MicroBatcher


def test_concurrent_requests_share_batches_and_keep_their_own_results():
    calls: list[list[int]] = []
    loop_threads: set[str] = set()

    def slow_square(items):
        calls.append(list(items))
        loop_threads.add(threading.current_thread().name)
        time.sleep(0.05)  # while this runs, the other requests queue up and form the next batch
        return [item * item for item in items]

    async def main():
        batcher = MicroBatcher(slow_square, max_batch_size=32, max_wait_s=0.001)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(40)))
        many = await batcher.submit_many([5, 6, 7])
        await batcher.aclose()
        return results, many, batcher.stats

    results, many, stats = asyncio.run(main())
    assert results == [i * i for i in range(40)] and many == [25, 36, 49]
    assert sum(len(call) for call in calls) == 43
    assert len(calls) < 40 and stats.largest_batch > 1  # batched, not one call per request
    assert max(len(call) for call in calls) <= 32
    assert stats.items == 43 and stats.batches == len(calls)
    assert all(name.startswith("micro-batch") for name in loop_threads)  # off the event loop


def test_a_failing_batch_fails_only_its_callers_and_the_worker_lives_on():
    def fragile(items):
        if "boom" in items:
            raise RuntimeError("bad item")
        return [item.upper() for item in items]

    async def main():
        batcher = MicroBatcher(fragile, max_batch_size=1)
        outcomes = await asyncio.gather(batcher.submit("boom"), batcher.submit("ok"), return_exceptions=True)
        after = await batcher.submit("still ok")
        await batcher.aclose()
        return outcomes, after

    outcomes, after = asyncio.run(main())
    assert isinstance(outcomes[0], RuntimeError) and outcomes[1] == "OK"
    assert after == "STILL OK"


def test_one_bad_item_in_a_shared_batch_fails_alone():
    calls: list[list[str]] = []

    def fragile(items):
        calls.append(list(items))
        if any("\ud800" in item for item in items):
            raise TypeError("the tokenizer cannot encode a lone surrogate")
        time.sleep(0.01)
        return [item.upper() for item in items]

    async def main():
        batcher = MicroBatcher(fragile, max_batch_size=64, max_wait_s=0.05)
        good = [f"query {i}" for i in range(20)]
        outcomes = await asyncio.gather(
            *(batcher.submit(item) for item in [*good[:10], "bad \ud800", *good[10:]]), return_exceptions=True
        )
        after = await batcher.submit("after")
        await batcher.aclose()
        return outcomes, after, batcher.stats

    outcomes, after, stats = asyncio.run(main())
    assert isinstance(outcomes[10], TypeError) and "surrogate" in str(outcomes[10])
    assert [outcome for i, outcome in enumerate(outcomes) if i != 10] == [f"QUERY {i}" for i in range(20)]
    assert after == "AFTER"
    assert len(calls[0]) > 1 and stats.isolated_batches >= 1 and stats.failed_items == 1


def test_wrong_output_length_is_reported():
    async def main():
        batcher = MicroBatcher(lambda items: items[:-1])
        with pytest.raises(RuntimeError, match="returned 0 outputs for 1 items"):  # each item, once isolated
            await batcher.submit_many(["a", "b"])
        await batcher.aclose()

    asyncio.run(main())


def test_closed_batcher_rejects_and_bad_settings_raise():
    async def main():
        batcher = MicroBatcher(lambda items: items)
        assert await batcher.submit(1) == 1
        await batcher.aclose()
        with pytest.raises(BatcherClosedError):
            await batcher.submit(2)

    asyncio.run(main())
    with pytest.raises(ValueError):
        MicroBatcher(lambda items: items, max_batch_size=0)
    with pytest.raises(ValueError):
        MicroBatcher(lambda items: items, max_wait_s=-1)


def test_a_batcher_survives_being_used_from_a_second_event_loop():
    batcher = MicroBatcher(lambda items: [item + 1 for item in items])
    assert asyncio.run(batcher.submit(1)) == 2
    assert asyncio.run(batcher.submit(2)) == 3  # a new loop gets a new worker
