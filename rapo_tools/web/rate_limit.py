"""A rate limiter: at most ``rate`` requests per second, with bursts up to ``burst``, in one process or many.

Paid search APIs bill and throttle per key, not per process: with
``make_vec(..., vectorization_mode="async")`` every env is a process, and per-process
limiters would send ``num_envs x rate``. Given a ``path``, the bucket lives in a SQLite
file (the search cache's, by default) and every process that opens the same file and
``name`` draws from one budget. A 429's ``Retry-After`` pauses that whole budget
(`RateLimiter.pause`), not just the request that got it.

The bucket is a reservation: each request takes a token at once, letting the count go
negative, and waits until its token would have been refilled. One short transaction per
request, and requests start in the order they asked.

Example:
    >>> import asyncio, os, tempfile
    >>> limiter = RateLimiter(rate_per_s=100.0, burst=2, path=os.path.join(tempfile.mkdtemp(), "budget.sqlite"))
    >>> async def three():
    ...     for _ in range(3):
    ...         await limiter.acquire()
    ...     return "done"
    >>> asyncio.run(three())
    'done'
    >>> limiter.close()
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from rapo_tools.web.cache import ThreadConnections

_SCHEMA = "CREATE TABLE IF NOT EXISTS rate_budgets (name TEXT PRIMARY KEY, tokens REAL NOT NULL, updated REAL NOT NULL)"


class RateLimiter:
    """A token bucket shared by all callers in this process, or, with ``path``, by every process using that file.

    Args:
        rate_per_s: Sustained requests per second; ``None`` or a value <= 0 disables limiting.
        burst: How many requests may start at once after an idle spell.
        path: SQLite file holding the budget for many processes; None keeps it in this process.
        name: Which budget in ``path`` (one per provider endpoint).
    """

    def __init__(self, rate_per_s: float | None, burst: int = 1, path: str | Path | None = None, name: str = ""):
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.rate_per_s = rate_per_s if rate_per_s and rate_per_s > 0 else None
        self.burst = burst
        self.name = name
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._state = (float(burst), time.time())  # (tokens, when they were counted) of the in-process bucket
        self._connections = ThreadConnections(self.path, schema=_SCHEMA) if self.path is not None else None

    async def acquire(self) -> None:
        """Wait until one request may start."""
        if self.rate_per_s is None:
            return
        wait_s = await asyncio.to_thread(self._update, 1.0, None) if self._connections else self._update(1.0, None)
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    def pause(self, seconds: float) -> None:
        """Start no request of this budget for ``seconds`` (a server's ``Retry-After``), in every process sharing it."""
        if self.rate_per_s is not None and seconds > 0:
            self._update(0.0, seconds)

    def _update(self, take: float, pause_s: float | None) -> float:
        """Refill, take ``take`` tokens (and push the budget ``pause_s`` into debt); the wait the taker owes."""
        if self._connections is None:
            with self._lock:
                now = time.time()
                tokens, wait_s = self._advance(*self._state, now, take, pause_s)
                self._state = (tokens, now)
                return wait_s
        connection = self._connections.get()
        connection.execute("BEGIN IMMEDIATE")  # the write lock first: one process at a time reads and writes
        try:
            row = connection.execute("SELECT tokens, updated FROM rate_budgets WHERE name = ?", (self.name,)).fetchone()
            now = time.time()
            tokens, wait_s = self._advance(*(row or (float(self.burst), now)), now, take, pause_s)
            connection.execute("INSERT OR REPLACE INTO rate_budgets (name, tokens, updated) VALUES (?, ?, ?)",
                               (self.name, tokens, now))
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        return wait_s

    def _advance(self, tokens: float, updated: float, now: float, take: float, pause_s: float | None
                 ) -> tuple[float, float]:
        # Wall-clock time, not monotonic: the state is read by other processes.
        tokens = min(float(self.burst), tokens + max(0.0, now - updated) * self.rate_per_s) - take
        if pause_s is not None:
            tokens = min(tokens, 1.0 - pause_s * self.rate_per_s)  # the next taker waits ``pause_s``
        return tokens, max(0.0, -tokens / self.rate_per_s)

    def close(self) -> None:
        """Close the budget file's connections (the limiter reopens them if used again)."""
        if self._connections is not None:
            self._connections.close()
