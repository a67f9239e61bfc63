"""A pool of warm workers shared process-wide, with fair (FIFO) queueing and automatic restarts.

Backends provide a ``spawn(slot) -> Worker`` coroutine; `WorkerPool` starts the workers
lazily on first use, hands them out one call at a time in arrival order, and replaces a
worker that died (the code may kill it). `PooledExecutor` is the backend API
(``run(code)`` / ``aclose()``) on top of a pool that every executor with the same config
in this process shares, so many environments never start many pools. Code that imports
only the standard library goes to light workers, whose forks are cheaper (as many as the
heavy ones by default: see `SandboxConfig.light_pool_size`).

Example:
    >>> import asyncio
    >>> from rapo_tools.aio import run_sync
    >>> class Echo(Worker):
    ...     alive = True
    ...     async def request(self, message, timeout_s):
    ...         return {"echo": message["code"]}
    ...     async def close(self):
    ...         self.alive = False
    >>> async def spawn(slot):
    ...     return Echo()
    >>> async def demo():
    ...     pool = WorkerPool(spawn, size=2)
    ...     replies = await asyncio.gather(*(pool.execute({"code": str(i)}, 1.0) for i in range(4)))
    ...     await pool.close()
    ...     return [reply["echo"] for reply in replies]
    >>> run_sync(demo())
    ['0', '1', '2', '3']
"""

from __future__ import annotations

import abc
import ast
import asyncio
import collections
import functools
import json
import os
import sys
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from rapo_tools.base import ServiceUnavailableError, ToolResult
from rapo_tools.sandbox.config import SandboxConfig
from rapo_tools.sandbox.repl import OutputStyle, format_execution_output, timeout_message
from rapo_tools.sandbox.worker import FRAME_HEADER, encode_frame

REPLY_GRACE_S = 5.0
"""Seconds past the call's timeout the host waits for a worker's reply before declaring it lost."""


class SandboxUnavailableError(ServiceUnavailableError):
    """Isolation (bubblewrap, a Docker engine) is not usable, or the workers cannot start."""


class WorkerLostError(Exception):
    """A worker died or stopped answering during a call (the pool replaces it)."""


class WorkerRetiredError(WorkerLostError):
    """The worker retired (or died) after its previous call, before it read this one: the pool retries it."""


def expect_ready(message: dict[str, Any] | None) -> None:
    """Check the message a worker sends between calls; raises `WorkerRetiredError` unless it is ready."""
    if message is None or not message.get("ready"):
        raise WorkerRetiredError("the worker could not clean up after its previous call and retired")


class Worker(abc.ABC):
    """One warm worker: sends a request frame, returns the reply frame."""

    alive: bool

    @abc.abstractmethod
    async def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``message`` and return the reply; raise `WorkerLostError` when the worker is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the worker and everything it runs."""


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    """Read one length-prefixed JSON frame (see `rapo_tools.sandbox.worker`)."""
    (length,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    return json.loads(await reader.readexactly(length))


async def within(awaitable: Awaitable[Any], timeout_s: float) -> Any:
    """``await awaitable``, raising `asyncio.TimeoutError` after ``timeout_s`` seconds.

    On Python 3.11+ it runs in the caller's task (``asyncio.timeout``): ``asyncio.wait_for`` would wrap it in a
    task of its own, which costs every sandbox call a task, two futures and extra event-loop turns (~7 us).
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):  # type: ignore[attr-defined]  # 3.11+
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)


class _FairSlots:
    """Slot numbers handed out strictly in arrival order (asyncio.Queue lets late callers barge in)."""

    def __init__(self, size: int) -> None:
        self._free = collections.deque(range(size))
        self._waiters: collections.deque[asyncio.Future[int]] = collections.deque()

    async def acquire(self) -> int:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed a slot just as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        return len(self._waiters)

    def release(self, slot: int) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.append(slot)


class WorkerPool:
    """``size`` workers made by ``spawn(slot)``; each call gets a whole worker, FIFO."""

    def __init__(self, spawn: Callable[[int], Awaitable[Worker]], size: int) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, not {size}")
        self.size = size
        self._spawn = spawn
        self._slots = _FairSlots(size)
        self._starting: list[asyncio.Task[Worker] | None] = [None] * size
        self._closed = False

    def _start(self, slot: int) -> None:
        self._starting[slot] = asyncio.ensure_future(self._spawn(slot))

    def start(self) -> None:
        """Start every worker that is not running, in the background (called on first use)."""
        for slot, task in enumerate(self._starting):
            if task is None:
                self._start(slot)

    async def _worker(self, slot: int) -> Worker:
        task = self._starting[slot]
        if task is None or (task.done() and (task.cancelled() or task.exception() or not task.result().alive)):
            self._start(slot)
            task = self._starting[slot]
        assert task is not None  # set just above
        try:
            return await asyncio.shield(task)
        except Exception as error:
            self._starting[slot] = None  # the next call tries again
            if isinstance(error, SandboxUnavailableError):
                raise
            raise SandboxUnavailableError(f"a sandbox worker could not start: {error}") from error

    async def execute(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Run one request on the next free worker (waiting in line when all are busy)."""
        if self._closed:
            raise SandboxUnavailableError("the sandbox pool is closed")
        self.start()
        slot = await self._slots.acquire()
        try:
            try:
                return await self._request(slot, message, timeout_s)
            except WorkerRetiredError:
                return await self._request(slot, message, timeout_s)  # it never ran: once more, on a fresh worker
        finally:
            self._slots.release(slot)

    async def _request(self, slot: int, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        worker = await self._worker(slot)
        # Tells the worker whether its next request will follow at once (then forking ahead would only cost).
        message = {**message, "calls_waiting": self._slots.waiting}
        try:
            return await worker.request(message, timeout_s)
        finally:
            if not worker.alive and not self._closed:
                self._start(slot)  # warm a replacement now, not on the next call

    async def close(self) -> None:
        """Stop every worker; calls made afterwards fail with `SandboxUnavailableError`."""
        self._closed = True
        tasks = [task for task in self._starting if task is not None]
        self._starting = [None] * self.size
        for task in tasks:
            if not task.done():
                task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Worker):
                await outcome.close()


_shared_pools: dict[Hashable, list[Any]] = {}


def _forget_pools_after_fork() -> None:
    # A forked child must not talk to its parent's workers; it starts its own pools.
    _shared_pools.clear()


os.register_at_fork(after_in_child=_forget_pools_after_fork)


def reply_to_result(reply: dict[str, Any], timeout_s: float, style: OutputStyle = "paper") -> ToolResult:
    """Turn a worker's reply into the `ToolResult` the model sees."""
    if reply["timed_out"]:
        return ToolResult(text=timeout_message(timeout_s), ok=False, timed_out=True,
                          truncated=reply["truncated"], error="timeout")
    text, ok = format_execution_output(reply["stdout"], reply["stderr"], reply["exit_code"], style)
    return ToolResult(text=text, ok=ok, truncated=reply["truncated"], error=None if ok else "execution_error")


def code_problem(code: object, limit_bytes: int) -> ToolResult | None:
    """The error result for code that must not be sent to a worker (too large), else None.

    Raises:
        TypeError: when ``code`` is not a string (a caller's mistake, not the model's).

    Example:
        >>> code_problem("x" * 11, 10).text
        'code too large (11 bytes, limit 10)'
        >>> code_problem("print(1)", 10) is None
        True
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, not {type(code).__name__}")
    if len(code) * 4 <= limit_bytes:
        return None  # no UTF-8 encoding can pass the limit: spare every call the encoding
    size = len(code.encode("utf-8", "surrogatepass"))
    if size <= limit_bytes:
        return None
    return ToolResult(text=f"code too large ({size} bytes, limit {limit_bytes})", ok=False, error="code_too_large")


MAX_PARSED_CHARS = 20_000
"""Longest code whose imports the host parses to pick a pool: ~15 ms on an idle core, ten times that at a load
average of 20 (model code is far shorter)."""


def imports_only_stdlib(code: str) -> bool:
    """True when every module ``code`` imports statically is in the standard library.

    Such code can run in a light worker; code that imports anything else (numpy, sympy, ...) goes to a
    full worker that has it preloaded. Unparsable code is light: it fails the same way anywhere. Code longer
    than `MAX_PARSED_CHARS` is not parsed (the parse runs on the event loop that serves every call): it goes
    to a full worker, which runs anything.

    Example:
        >>> imports_only_stdlib("import math, itertools\\nfrom fractions import Fraction")
        True
        >>> imports_only_stdlib("import numpy as np")
        False
    """
    if "import" not in code:
        return True  # no import statement, and nothing to parse
    if len(code) > MAX_PARSED_CHARS:
        return False
    try:
        tree = ast.parse(code)
    except Exception:  # SyntaxError, but also RecursionError or MemoryError on hostile nesting
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name.partition(".")[0] not in sys.stdlib_module_names for name in names):
            return False
    return True


class PooledExecutor:
    """Backend API over process-wide pools shared by every executor with the same config.

    Two pools per config: full workers (every preloaded module, warmed up) and, with
    ``config.light_pool``, light workers (standard-library modules only) for code that imports
    nothing else. Which pool runs a call changes its speed, never its result.

    Args:
        config: The sandbox settings (timeout, output cap, pool size, preloads).
        spawn: ``spawn(slot, light)`` starts one worker; called on the portal loop.
    """

    def __init__(self, config: SandboxConfig, spawn: Callable[[int, bool], Awaitable[Worker]]) -> None:
        self.config = config
        self._spawn = spawn
        self._pools: dict[bool, WorkerPool] = {}
        self._pid = os.getpid()

    def _key(self, light: bool) -> Hashable:
        return (type(self).__name__, self.config, light)

    def _pool(self, light: bool) -> WorkerPool:
        if self._pid != os.getpid():
            # Forked (e.g. into a vector-env worker): the parent's workers are not ours to use.
            self._pools, self._pid = {}, os.getpid()
        if light not in self._pools:
            entry = _shared_pools.get(self._key(light))
            if entry is None:
                size = self.config.light_workers if light else self.config.workers
                pool = WorkerPool(functools.partial(self._spawn, light=light), size)
                entry = _shared_pools[self._key(light)] = [pool, 0]
            entry[1] += 1
            self._pools[light] = entry[0]
        return self._pools[light]

    async def run(self, code: str) -> ToolResult:
        """Execute ``code`` with REPL semantics in a fresh fork of a warm worker; never raises for any string."""
        problem = code_problem(code, self.config.max_code_bytes)
        if problem is not None:
            return problem
        light = self.config.light_pool and imports_only_stdlib(code)
        message = {"code": code, "timeout_s": self.config.timeout_s, "max_output_bytes": self.config.max_output_bytes}
        try:
            reply = await self._pool(light).execute(message, self.config.timeout_s + REPLY_GRACE_S)
        except WorkerLostError as error:
            return ToolResult(
                text=f"The sandbox worker died during the call ({error}); the call was abandoned. "
                "A fresh worker is starting.",
                ok=False,
                error="sandbox_worker_lost",
            )
        return reply_to_result(reply, self.config.timeout_s, self.config.output)

    async def aclose(self) -> None:
        """Let go of the shared pools; the last executor to let go of a pool stops its workers."""
        pools, self._pools = self._pools, {}
        for light, pool in pools.items():
            entry = _shared_pools.get(self._key(light))
            if entry is None or entry[0] is not pool:
                continue  # the pool belongs to a parent process (we were forked) or is already gone
            entry[1] -= 1
            if entry[1] <= 0:
                del _shared_pools[self._key(light)]
                await pool.close()


class StreamWorker(Worker):
    """A worker reached through an asyncio stream pair (a local process's stdin/stdout).

    After each reply the worker cleans up and then says it is ready; the next request is sent
    without waiting for that, and the ready message is read before its reply.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: Any, stop: Callable[[], Awaitable[None]],
                 describe_death: Callable[[], str]) -> None:
        self.alive = True
        self._reader = reader
        self._writer = writer
        self._stop = stop
        self._describe_death = describe_death
        self._ready_pending = False  # the spawner read the start-up ready message

    async def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if not self.alive:
            raise WorkerLostError("the worker had already stopped")
        try:
            self._writer.write(encode_frame(message))
            reply = await within(self._exchange(), timeout_s)
        except BaseException as error:
            # A half-finished exchange would desynchronise the protocol: this worker is done for.
            await self.close()
            if isinstance(error, (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError)):
                reason = "it stopped answering" if isinstance(error, asyncio.TimeoutError) else "it exited"
                raise WorkerLostError(f"{reason}{self._describe_death()}") from error
            raise
        return reply

    async def _exchange(self) -> dict[str, Any]:
        try:
            await self._writer.drain()
        except ConnectionError:
            if self._ready_pending:  # it left after its previous call: retired (or died) before reading this one
                expect_ready(await self._message_between_calls())
            raise
        if self._ready_pending:
            expect_ready(await self._message_between_calls())
        reply = await read_frame(self._reader)
        self._ready_pending = True
        return reply

    async def _message_between_calls(self) -> dict[str, Any] | None:
        try:
            return await read_frame(self._reader)
        except asyncio.IncompleteReadError:
            return None  # it exited without a word

    async def close(self) -> None:
        if self.alive:
            self.alive = False
            await self._stop()
