"""An async JSON client for rapo's services, and the one retry policy rapo's HTTP clients share.

`RetryPolicy` decides what is sent again, for `RetryingClient` and for `OpenAIPolicy` alike:

- a request that never reached the server (connection refused, connect timeout) is retried;
- a request the server may be working on (read timeout, dropped connection) is retried only when it is
  idempotent (GET, HEAD, ...): a timed-out generation is not sent, and billed, again;
- 408, 429 and 5xx answers are retried after the server's ``Retry-After`` when it sends one (up to
  ``max_retry_after_s``; a longer wait gives up at once), else after exponential back-off with jitter.
  The wait is also told to `retry_after_listener`, so that a caller can pause a shared rate budget
  (the web ``<search>`` tool does) without every client layer in between passing a callback down.

What still fails in `RetryingClient` becomes a `rapo_tools.base` error that tools turn into a failed
`ToolResult`:

- no answer in time -> `ToolTimeoutError`
- unreachable, or 429/5xx after every retry, or a non-JSON answer -> `ServiceUnavailableError`
- any other 4xx -> `BadToolInputError` carrying the server's message (not retried: it would fail again)

The underlying ``httpx.AsyncClient`` is created on first use inside the running
loop, so build the client anywhere and use it from one loop (tools use the portal loop).

Example:
    >>> from rapo_tools.aio import run_sync
    >>> client = RetryingClient("http://127.0.0.1:9", timeout_s=0.5, retries=1, backoff_s=0.01)
    >>> try:
    ...     run_sync(client.get_json("/health"))
    ... except ServiceUnavailableError as error:
    ...     print(type(error).__name__)
    ServiceUnavailableError
    >>> run_sync(client.aclose())
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import email.utils
import json
import random
import time
from collections.abc import Callable
from typing import Any

import httpx

from rapo_tools.base import BadToolInputError, ServiceUnavailableError, ToolTimeoutError

RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
_MAX_SERVER_MESSAGE_CHARS = 500

retry_after_listener: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "retry_after_listener", default=None
)
"""Called with the seconds of every ``Retry-After`` a `RetryPolicy` receives in this context (task)."""


def retry_after_s(response: httpx.Response) -> float | None:
    """The wait a ``Retry-After`` header asks for (seconds or an HTTP date), or None when absent or unreadable."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When a request is sent again, and after how long (see the module docstring).

    Example:
        >>> RetryPolicy(retries=2, backoff_s=0.5, jitter=0.0).delay_s(attempt=2, response=None)
        1.0
    """

    retries: int = 3
    """Extra attempts after the first (0 disables retrying)."""
    backoff_s: float = 0.2
    """Delay before the first retry; doubles at each further retry."""
    jitter: float = 0.25
    """Each back-off is stretched by up to this fraction, at random, so that many clients do not retry in step."""
    max_retry_after_s: float = 60.0
    """Longest ``Retry-After`` honoured; a server asking for more gets its answer passed on, not a retry."""

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.jitter < 0 or self.max_retry_after_s < 0:
            raise ValueError("retries, backoff_s, jitter and max_retry_after_s must be >= 0")

    def delay_s(self, attempt: int, response: httpx.Response | None) -> float | None:
        """The wait before attempt ``attempt`` (1 = the first retry); None when the server asks for too long."""
        asked = retry_after_s(response) if response is not None else None
        if asked is not None:
            return asked if asked <= self.max_retry_after_s else None
        return self.backoff_s * 2 ** (attempt - 1) * (1 + random.random() * self.jitter)

    async def send(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        json: Any = None,
        idempotent: bool | None = None,
        limit: asyncio.Semaphore | None = None,
    ) -> httpx.Response:
        """Send one request under this policy and return the last answer (which may still be a 429 or 5xx).

        Raises the last ``httpx.TransportError`` when no answer came back. ``idempotent`` defaults to the
        method's HTTP semantics; ``limit`` bounds the attempts in flight (not the waits between them).
        """
        if idempotent is None:
            idempotent = method.upper() in IDEMPOTENT_METHODS
        attempt = 0
        while True:
            response = None
            try:
                if limit is None:
                    response = await client.request(method, url, json=json)
                else:
                    async with limit:
                        response = await client.request(method, url, json=json)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
                if attempt >= self.retries:  # never reached the server: always safe to send again
                    raise
            except httpx.TransportError:
                if not idempotent or attempt >= self.retries:  # the server may have done (and billed) the work
                    raise
            if response is not None and (response.status_code not in RETRIED_STATUS or attempt >= self.retries):
                return response
            attempt += 1
            listener = retry_after_listener.get()
            asked = retry_after_s(response) if response is not None else None
            if listener is not None and asked is not None:
                listener(min(asked, self.max_retry_after_s))  # an hour's Retry-After must not stall a run
            delay = self.delay_s(attempt, response)
            if delay is None:
                return response
            await asyncio.sleep(delay)


def _server_message(response: httpx.Response) -> str:
    """The most useful human-readable part of an error answer (FastAPI puts it under ``detail``)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:_MAX_SERVER_MESSAGE_CHARS]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return text[:_MAX_SERVER_MESSAGE_CHARS]


class RetryingClient:
    """JSON-over-HTTP client with per-attempt timeouts, bounded concurrency and retries (`RetryPolicy`).

    Args:
        base_url: The service root, e.g. ``"http://127.0.0.1:8000"``.
        timeout_s: Time limit of one attempt (connect + read).
        retries: Extra attempts after the first for retryable failures (0 disables retrying).
        backoff_s: Delay before the first retry; doubles at each further retry.
        max_concurrency: Requests in flight at once through this client; more wait their turn.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_concurrency: int = 64,
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.policy = RetryPolicy(retries=retries, backoff_s=backoff_s)
        self.max_concurrency = max_concurrency
        self._client: httpx.AsyncClient | None = None
        self._semaphore = asyncio.Semaphore(max_concurrency)

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, limits=limits)
        return self._client

    async def post_json(self, path: str, payload: Any) -> Any:
        """POST ``payload`` as JSON to ``path`` and return the decoded JSON answer."""
        return await self.request_json("POST", path, payload)

    async def get_json(self, path: str) -> Any:
        """GET ``path`` and return the decoded JSON answer."""
        return await self.request_json("GET", path)

    async def request_json(self, method: str, path: str, payload: Any = None) -> Any:
        """Send one request with retries; see the module docstring for the errors raised."""
        client = self._ensure_client()
        url = f"{self.base_url}{path}"
        try:
            response = await self.policy.send(client, method, path, json=payload, limit=self._semaphore)
        except httpx.TimeoutException as error:
            raise ToolTimeoutError(f"{method} {url} got no answer within {self.timeout_s:g} s") from error
        except (httpx.ConnectError, httpx.RemoteProtocolError) as error:
            raise ServiceUnavailableError(
                f"cannot reach {url}: {type(error).__name__}: {error} (after {self.retries + 1} attempts)"
            ) from error
        except httpx.HTTPError as error:
            raise ServiceUnavailableError(f"{method} {url} failed: {type(error).__name__}: {error}") from error
        if response.status_code in RETRIED_STATUS:
            raise ServiceUnavailableError(
                f"{method} {url} answered {response.status_code}: {_server_message(response)} "
                f"(after {self.retries + 1} attempts)"
            )
        if 400 <= response.status_code < 500:
            raise BadToolInputError(
                f"{method} {url} rejected the request ({response.status_code}): {_server_message(response)}"
            )
        if response.status_code >= 400:
            raise ServiceUnavailableError(f"{method} {url} answered {response.status_code}")
        try:
            return response.json()
        except ValueError as error:
            raise ServiceUnavailableError(f"{method} {url} answered with invalid JSON") from error

    async def aclose(self) -> None:
        """Close the connection pool; the client reopens one if used again."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
