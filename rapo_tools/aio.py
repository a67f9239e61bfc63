"""One background event loop (the *portal*) that owns every tool's async resources.

Tools hold loop-bound resources (httpx clients, subprocess pipes, queues). Callers
come from everywhere: plain synchronous code, Gymnasium vector-env workers, a
thread pool in the rollout engine, or a user's own event loop. Running all tool
coroutines on one long-lived loop means a resource is always used on the loop
that created it, whoever calls.

Example:
    >>> import asyncio
    >>> from rapo_tools.aio import run_sync
    >>> async def double(x):
    ...     await asyncio.sleep(0)
    ...     return 2 * x
    >>> run_sync(double(21))
    42
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def portal_loop() -> asyncio.AbstractEventLoop:
    """Return the portal loop, starting its daemon thread on first use (and after a fork)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rapo-tools-portal", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Schedule ``coro`` on the portal loop and return a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, portal_loop())


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the portal loop and block until it finishes.

    Raises:
        RuntimeError: when called from the portal loop itself, which would deadlock.
    """
    loop = portal_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync() was called on the tool portal loop; await the coroutine instead")
    return submit(coro).result(timeout)


async def on_portal(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the portal loop from any event loop."""
    loop = portal_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(submit(coro))


def _reset_after_fork() -> None:
    # A forked child inherits the loop object but not its thread.
    global _loop, _thread
    _loop, _thread = None, None


def _shutdown() -> None:
    if _loop is not None and _thread is not None and _thread.is_alive():
        _loop.call_soon_threadsafe(_loop.stop)


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_reset_after_fork)
