"""An async rate limiter: at most ``rate`` requests per second, with bursts up to ``burst``.

Paid search APIs bill and throttle per second; a token bucket keeps a whole
rollout batch (many episodes searching at once) under the provider's limit
instead of collecting 429s.

Example:
    >>> import asyncio
    >>> limiter = RateLimiter(rate_per_s=100.0, burst=2)
    >>> async def three():
    ...     for _ in range(3):
    ...         await limiter.acquire()
    ...     return "done"
    >>> asyncio.run(three())
    'done'
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """A token bucket shared by all callers on one event loop.

    Args:
        rate_per_s: Sustained requests per second; ``None`` or a value <= 0 disables limiting.
        burst: How many requests may start at once after an idle spell.
    """

    def __init__(self, rate_per_s: float | None, burst: int = 1):
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.rate_per_s = rate_per_s if rate_per_s and rate_per_s > 0 else None
        self.burst = burst
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self) -> None:
        """Wait until one request may start."""
        if self.rate_per_s is None:
            return
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:  # an asyncio.Lock belongs to one loop (forks, asyncio.run)
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:  # one waiter at a time keeps the order fair
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
                self._updated = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self._tokens) / self.rate_per_s)
