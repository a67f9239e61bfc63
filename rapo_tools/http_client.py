"""An async JSON client for rapo's services: timeouts, retries with back-off, typed errors.

Connection failures, 429 and 5xx answers are retried with exponential back-off;
what still fails becomes a `rapo_tools.base` error that tools turn into a failed
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
import json
from typing import Any

import httpx

from rapo_tools.base import BadToolInputError, ServiceUnavailableError, ToolTimeoutError

_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_SERVER_MESSAGE_CHARS = 500


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
    """JSON-over-HTTP client with per-attempt timeouts, bounded concurrency and retries.

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
        last_problem = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with self._semaphore:
                    response = await client.request(method, path, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as error:
                last_problem = f"cannot reach {url}: {type(error).__name__}: {error}"
                continue
            except httpx.TimeoutException as error:
                # The service accepted the request but is slow; repeating it would only double the wait.
                raise ToolTimeoutError(f"{method} {url} got no answer within {self.timeout_s:g} s") from error
            except httpx.HTTPError as error:
                last_problem = f"{method} {url} failed: {type(error).__name__}: {error}"
                continue
            if response.status_code in _RETRIED_STATUS:
                last_problem = f"{method} {url} answered {response.status_code}: {_server_message(response)}"
                continue
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
        raise ServiceUnavailableError(f"{last_problem} (after {self.retries + 1} attempts)")

    async def aclose(self) -> None:
        """Close the connection pool; the client reopens one if used again."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
