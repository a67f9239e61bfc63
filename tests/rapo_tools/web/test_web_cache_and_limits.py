"""The search disk cache under concurrent writers (threads and processes) and the rate limiter."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import subprocess
import sys
import threading
import time

from rapo_tools.aio import run_sync
from rapo_tools.web.cache import SearchCache
from rapo_tools.web.rate_limit import RateLimiter
from rapo_tools.web.results import SearchResult
from rapo_tools.web.search_tool import WebSearchTool

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


BUDGET_USER = """
import asyncio, json, sys, time
from rapo_tools.web.rate_limit import RateLimiter

path, start_at, count = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
limiter = RateLimiter(rate_per_s=10.0, burst=1, path=path, name="bing https://api.example/search")

async def main():
    stamps = []
    for _ in range(count):
        await limiter.acquire()
        stamps.append(time.time())
    return stamps

time.sleep(max(0.0, start_at - time.time()))  # both processes start asking at the same moment
print(json.dumps(asyncio.run(main())))
"""


def test_two_processes_share_one_rate_budget(tmp_path):
    start_at = time.time() + 4.0
    users = [
        subprocess.Popen([sys.executable, "-c", BUDGET_USER, str(tmp_path / "search.sqlite"), str(start_at), "6"],
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    stamps = sorted(stamp for user in users for stamp in json.loads(user.communicate(timeout=60)[0]))
    assert len(stamps) == 12
    # The token-bucket promise, across both processes: between any two starts, no more than the burst plus
    # what the rate refilled (half a token of slack for clock reads). Two private budgets break it at once.
    for first in range(len(stamps)):
        for last in range(first + 1, len(stamps)):
            assert last - first <= 1 + (stamps[last] - stamps[first]) * 10.0 + 0.5, (first, last)


def test_retry_after_pauses_the_budget_for_everyone_sharing_it(tmp_path):
    path = tmp_path / "search.sqlite"
    throttled = RateLimiter(rate_per_s=100.0, burst=5, path=path, name="bing")
    other = RateLimiter(rate_per_s=100.0, burst=5, path=path, name="bing")  # as in another process
    unrelated = RateLimiter(rate_per_s=100.0, burst=5, path=path, name="brave")
    throttled.pause(1.0)

    async def wait_s(limiter: RateLimiter) -> float:
        start = time.monotonic()
        await limiter.acquire()
        return time.monotonic() - start

    assert asyncio.run(wait_s(other)) >= 0.9
    assert asyncio.run(wait_s(unrelated)) < 0.9  # another endpoint's budget is not paused
    for limiter in (throttled, other, unrelated):
        limiter.close()


def test_in_process_limiter_honours_a_pause():
    limiter = RateLimiter(rate_per_s=100.0, burst=5)
    limiter.pause(0.5)
    start = time.monotonic()
    asyncio.run(limiter.acquire())
    assert time.monotonic() - start >= 0.4


def test_a_429_retry_after_pauses_every_search_sharing_the_budget(web_url, bing_key, tmp_path):
    config = {"provider": "bing", "endpoint": f"{web_url}/throttled/v7.0/search", "api_key_env": bing_key,
              "retries": 2, "backoff_s": 0.01, "rate_per_s": 1000.0, "burst": 10, "cache_path": str(tmp_path / "c")}

    async def both(throttled: WebSearchTool, other: WebSearchTool) -> float:
        async def later() -> float:
            await asyncio.sleep(0.3)  # while the first search waits out its Retry-After
            start = time.monotonic()
            await other.search("Nile")
            return time.monotonic() - start

        _, waited = await asyncio.gather(throttled.search("Ada Lovelace"), later())
        return waited

    with WebSearchTool(config) as throttled, WebSearchTool(config) as other:
        waited = run_sync(both(throttled, other))  # on the portal loop, where the tools close their clients
    assert waited >= 0.5  # the burst of 10 was open, but the server's pause holds for everyone on the budget


OPENER = """
import sys, time
from rapo_tools.web.rate_limit import RateLimiter
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
RateLimiter(rate_per_s=10.0, burst=1, path=sys.argv[1], name="bing").close()
print("opened")
"""


def test_processes_opening_a_fresh_shared_file_at_once_all_get_it(tmp_path):
    # Turning a new file to WAL mode is refused at once ("database is locked") while another process does the
    # same; every opener must wait its turn instead of failing.
    for round_ in range(3):
        start_at = time.time() + 1.5
        openers = [subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path / f"{round_}.sqlite"), str(start_at)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
        results = [opener.communicate(timeout=60) for opener in openers]
        assert [out.strip() for out, _ in results] == ["opened"] * 8, [err[-300:] for _, err in results if err]
