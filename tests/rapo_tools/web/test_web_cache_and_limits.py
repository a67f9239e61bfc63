"""The search disk cache under concurrent writers (threads and processes) and the rate limiter."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

from rapo_tools.web.cache import SearchCache
from rapo_tools.web.rate_limit import RateLimiter
from rapo_tools.web.results import SearchResult

WRITES_PER_WORKER = 40


def _write_many(path: str, worker: int) -> None:
    cache = SearchCache(path)
    for number in range(WRITES_PER_WORKER):
        key = cache.key("bing", "endpoint", f"query {worker}-{number}", 10)
        cache.put(key, [SearchResult(f"title {worker}-{number}", "https://x.example", "s" * 200)])
        # Everyone also rewrites one shared key, so that writers really collide.
        cache.put(cache.key("bing", "endpoint", "shared", 10), [SearchResult(f"w{worker}", "u", "s")])
    cache.close()


def test_concurrent_processes_and_threads_lose_nothing(tmp_path):
    path = str(tmp_path / "cache.sqlite")
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_write_many, args=(path, worker)) for worker in range(4)]
    threads = [threading.Thread(target=_write_many, args=(path, worker)) for worker in range(4, 7)]
    for runner in processes + threads:
        runner.start()
    for runner in processes + threads:
        runner.join(timeout=60)
    assert all(process.exitcode == 0 for process in processes)
    cache = SearchCache(path)
    assert len(cache) == 7 * WRITES_PER_WORKER + 1
    for worker in range(7):
        for number in range(WRITES_PER_WORKER):
            hits = cache.get(cache.key("bing", "endpoint", f"query {worker}-{number}", 10))
            assert hits is not None and hits[0].title == f"title {worker}-{number}"
    assert cache.get(cache.key("bing", "endpoint", "shared", 10))[0].title.startswith("w")
    cache.close()


def test_keys_separate_providers_endpoints_and_top_k():
    keys = {
        SearchCache.key("bing", "a", "q", 10),
        SearchCache.key("brave", "a", "q", 10),
        SearchCache.key("bing", "b", "q", 10),
        SearchCache.key("bing", "a", "q", 5),
    }
    assert len(keys) == 4
    assert SearchCache.key("bing", "a", "two  words", 10) == SearchCache.key("bing", "a", "two words", 10)


def test_rate_limiter_spaces_requests():
    limiter = RateLimiter(rate_per_s=20.0, burst=1)

    async def run() -> float:
        start = time.monotonic()
        await asyncio.gather(*(limiter.acquire() for _ in range(6)))
        return time.monotonic() - start

    # 6 requests at 20/s with no burst need at least 5 gaps of 50 ms.
    assert asyncio.run(run()) >= 0.2


def test_disabled_rate_limiter_does_not_wait():
    limiter = RateLimiter(None)
    asyncio.run(limiter.acquire())
    assert limiter.rate_per_s is None
