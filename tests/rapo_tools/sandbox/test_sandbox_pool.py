"""The worker pool: FIFO hand-out, bounded concurrency, restarts after a worker dies."""

from __future__ import annotations

import asyncio
import sys

import pytest

from rapo_tools.aio import run_sync
from rapo_tools.sandbox.pool import (
    MAX_PARSED_CHARS,
    SandboxUnavailableError,
    StreamWorker,
    Worker,
    WorkerLostError,
    WorkerPool,
    WorkerRetiredError,
    imports_only_stdlib,
)

from .conftest import SERVER_PID


class RecordingWorker(Worker):
    """Answers after a short pause, recording the order of requests and how many run at once."""

    def __init__(self, log: list, active: list) -> None:
        self.alive = True
        self.log = log
        self.active = active

    async def request(self, message, timeout_s):
        self.active[0] += 1
        self.active[1] = max(self.active[1], self.active[0])
        try:
            self.log.append(message["code"])
            await asyncio.sleep(0.01)
            if message["code"] == "die":
                self.alive = False
                raise WorkerLostError("killed by the code")
            if message["code"] == "retire":
                self.alive = False  # answered, but cannot take another call
            return {"echo": message["code"]}
        finally:
            self.active[0] -= 1

    async def close(self):
        self.alive = False


def _pool(size: int):
    log, active, spawned = [], [0, 0], []

    async def spawn(slot):
        spawned.append(slot)
        return RecordingWorker(log, active)

    return WorkerPool(spawn, size), log, active, spawned


@pytest.mark.parametrize("size", [1, 3])
def test_calls_are_served_in_arrival_order_with_bounded_concurrency(size):
    async def scenario():
        pool, log, active, _ = _pool(size=size)
        calls = []
        for index in range(12):
            calls.append(asyncio.ensure_future(pool.execute({"code": str(index)}, 1.0)))
            await asyncio.sleep(0)  # arrivals are spread over time, as from many episodes
        replies = await asyncio.gather(*calls)
        await pool.close()
        return log, active, replies

    log, active, replies = run_sync(scenario())
    assert active[1] == size  # never more calls at once than workers
    assert [reply["echo"] for reply in replies] == [str(i) for i in range(12)]
    # Calls start in arrival order, up to the few that share a round of free workers.
    started = [int(code) for code in log]
    assert all(index - size < position < index + size for position, index in enumerate(started))
    if size == 1:
        assert started == list(range(12))


def test_a_cancelled_waiter_does_not_lose_its_place_for_others():
    async def scenario():
        pool, log, _, _ = _pool(size=1)
        first = asyncio.ensure_future(pool.execute({"code": "a"}, 1.0))
        await asyncio.sleep(0)
        doomed = asyncio.ensure_future(pool.execute({"code": "b"}, 1.0))
        last = asyncio.ensure_future(pool.execute({"code": "c"}, 1.0))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.gather(first, last)
        await pool.close()
        return log

    assert run_sync(scenario()) == ["a", "c"]


def test_a_dead_worker_is_replaced():
    async def scenario():
        pool, log, _, spawned = _pool(size=1)
        with pytest.raises(WorkerLostError):
            await pool.execute({"code": "die"}, 1.0)
        reply = await pool.execute({"code": "after"}, 1.0)
        await pool.close()
        return reply, spawned

    reply, spawned = run_sync(scenario())
    assert reply == {"echo": "after"} and spawned == [0, 0]


def test_a_retiring_worker_answers_and_is_replaced():
    async def scenario():
        pool, _, _, spawned = _pool(size=1)
        first = await pool.execute({"code": "retire"}, 1.0)
        second = await pool.execute({"code": "next"}, 1.0)
        await pool.close()
        return first, second, spawned

    first, second, spawned = run_sync(scenario())
    assert first == {"echo": "retire"} and second == {"echo": "next"} and spawned == [0, 0]


class RetiredWorker(Worker):
    """Retired after its previous call: it never runs the next one."""

    alive = True

    async def request(self, message, timeout_s):
        self.alive = False
        raise WorkerRetiredError("could not clean up after its previous call")

    async def close(self):
        self.alive = False


def test_a_call_sent_to_a_worker_that_had_retired_runs_on_a_fresh_one():
    log, spawned = [], []

    async def spawn(slot):
        spawned.append(slot)
        return RetiredWorker() if len(spawned) == 1 else RecordingWorker(log, [0, 0])

    async def scenario():
        pool = WorkerPool(spawn, 1)
        reply = await pool.execute({"code": "x"}, 1.0)
        await pool.close()
        return reply

    assert run_sync(scenario()) == {"echo": "x"}
    assert log == ["x"] and spawned == [0, 0]


# A stand-in for the worker program: answers one request, then retires instead of saying it is ready.
ONE_CALL_WORKER = """
import json, os, struct, sys
header = os.read(0, 4)
request = json.loads(os.read(0, struct.unpack(">I", header)[0]))
for message in ({"echo": request["code"]}, {"worker_retiring": True}):
    body = json.dumps(message).encode()
    os.write(1, struct.pack(">I", len(body)) + body)
"""


def test_a_stream_worker_that_retires_after_its_reply_costs_the_next_call_nothing():
    async def spawn(slot):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ONE_CALL_WORKER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )

        async def stop():
            if process.returncode is None:
                process.kill()
            await process.wait()

        return StreamWorker(process.stdout, process.stdin, stop, lambda: "")

    async def scenario():
        pool = WorkerPool(spawn, 1)
        replies = [await pool.execute({"code": code}, 5.0) for code in ("a", "b", "c")]
        await pool.close()
        return replies

    assert run_sync(scenario()) == [{"echo": "a"}, {"echo": "b"}, {"echo": "c"}]


def test_a_worker_that_cannot_start_is_reported_and_retried():
    attempts = []

    async def spawn(slot):
        attempts.append(slot)
        if len(attempts) == 1:
            raise OSError("no such interpreter")
        return RecordingWorker([], [0, 0])

    async def scenario():
        pool = WorkerPool(spawn, 1)
        with pytest.raises(SandboxUnavailableError, match="no such interpreter"):
            await pool.execute({"code": "x"}, 1.0)
        reply = await pool.execute({"code": "y"}, 1.0)
        await pool.close()
        with pytest.raises(SandboxUnavailableError):
            await pool.execute({"code": "z"}, 1.0)
        return reply

    assert run_sync(scenario()) == {"echo": "y"}


def test_the_real_pool_restarts_a_killed_worker(single_worker_sandbox):
    lost = single_worker_sandbox.run_sync(f"import os\nos.kill({SERVER_PID}, 9)")
    assert not lost.ok and lost.error == "sandbox_worker_lost"
    after = single_worker_sandbox.run_sync("import numpy\nprint(numpy.int64(2) ** 10)")
    assert after.ok and after.text == "1024\n"


@pytest.mark.parametrize(
    ("code", "light"),
    [
        ("import math\nmath.pi", True),
        ("import numpy", False),
        ("import os\n" + "-" * 15000 + "1", True),  # the parser gives up (MemoryError): light, it fails anywhere
        ("import os\n" + "x = 1\n" * (MAX_PARSED_CHARS // 6), False),  # too long to parse on the event loop
        ("x = 1\n" * 100_000, True),  # no import at all: nothing to parse
    ],
    ids=["stdlib", "numpy", "parser-gives-up", "too-long-to-parse", "no-import"],
)
def test_which_pool_runs_the_code(code, light):
    assert imports_only_stdlib(code) is light
