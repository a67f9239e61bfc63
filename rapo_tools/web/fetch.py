"""Fetch one web page safely: http(s) only, no private addresses unless allowed, capped size and time.

Redirects are followed by hand so that every hop is checked against the same
address policy (a public page must not redirect the fetcher into the local
network) and loops are caught. The body is streamed and cut at ``max_bytes``, so
a 50 MB page costs at most ``max_bytes`` of memory.

Example:
    >>> check_url("ftp://example.com/file")
    Traceback (most recent call last):
    ...
    rapo_tools.base.BadToolInputError: only http and https URLs can be browsed, got 'ftp://example.com/file'
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
import urllib.parse

import httpx

from rapo_tools.base import BadToolInputError, ServiceUnavailableError, ToolError, ToolTimeoutError

_REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "Mozilla/5.0 (compatible; rapo-browse/0.1; +https://github.com/rapo)"


class BlockedAddressError(ToolError):
    """The URL points at a private, loopback or otherwise internal address and those are not allowed."""

    kind = "blocked_address"


class FetchError(ToolError):
    """The page answered, but not with something readable (error status, redirect loop, binary data)."""

    kind = "fetch_failed"


@dataclasses.dataclass(frozen=True)
class FetchedPage:
    """The raw result of a fetch."""

    url: str
    """The final URL, after redirects."""
    status: int
    """The HTTP status of the final answer."""
    content_type: str
    """The media type without parameters, lower case (``text/html``), or "" when the server sent none."""
    charset: str | None
    """The charset the server declared, if any."""
    body: bytes
    """The body, at most ``max_bytes`` long."""
    truncated: bool
    """True when the body was cut at ``max_bytes``."""


def check_url(url: str) -> urllib.parse.SplitResult:
    """Parse ``url`` and refuse anything that is not an absolute http(s) URL with a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise BadToolInputError(f"only http and https URLs can be browsed, got {url[:200]!r}")
    if not parts.hostname:
        raise BadToolInputError(f"the URL {url[:200]!r} has no host name")
    return parts


def _is_internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``, with the default port made explicit (for allow-lists)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


async def check_address(host: str, port: int, allow_private: bool) -> None:
    """Resolve ``host`` and refuse it when any of its addresses is internal and those are not allowed."""
    if allow_private:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ServiceUnavailableError(f"cannot resolve the host {host!r}: {error}") from error
    for info in infos:
        if _is_internal(info[4][0]):
            raise BlockedAddressError(
                f"refusing to browse {host!r}: it resolves to the internal address {info[4][0]} "
                "(private and loopback addresses are not allowed here)"
            )


class PageFetcher:
    """Fetches pages with httpx under the limits below.

    Args:
        max_bytes: Largest body kept; longer bodies are cut (and marked truncated).
        timeout_s: Time limit for the whole fetch, redirects included.
        max_redirects: Redirect hops followed before giving up.
        allow_private: Allow private, loopback and link-local addresses (tests, local mirrors).
        allowed_origins: Origins (``http://127.0.0.1:8000``) allowed even when internal, e.g. the offline site,
            without opening the rest of the local network.
    """

    def __init__(
        self,
        max_bytes: int = 2_000_000,
        timeout_s: float = 15.0,
        max_redirects: int = 5,
        allow_private: bool = False,
        allowed_origins: tuple[str, ...] = (),
    ):
        if max_bytes < 1 or timeout_s <= 0 or max_redirects < 0:
            raise ValueError("max_bytes and timeout_s must be positive and max_redirects >= 0")
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self.allow_private = allow_private
        self.allowed_origins = frozenset(origin_of(origin) for origin in allowed_origins)
        self._client: httpx.AsyncClient | None = None

    async def fetch(self, url: str) -> FetchedPage:
        """Fetch ``url``; raises `BadToolInputError`, `BlockedAddressError`, `FetchError`,
        `ToolTimeoutError` or `ServiceUnavailableError`."""
        try:
            return await asyncio.wait_for(self._follow(url), self.timeout_s)
        except asyncio.TimeoutError as error:
            raise ToolTimeoutError(f"the page {url[:200]} did not load within {self.timeout_s:g} s") from error

    async def _follow(self, url: str) -> FetchedPage:
        client = self._ensure_client()
        seen: set[str] = set()
        for _ in range(self.max_redirects + 1):
            parts = check_url(url)
            allowed = self.allow_private or origin_of(url) in self.allowed_origins
            await check_address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), allowed)
            seen.add(url)
            try:
                async with client.stream("GET", url) as response:
                    if response.status_code in _REDIRECT_STATUS and "location" in response.headers:
                        target = urllib.parse.urljoin(url, response.headers["location"])
                        if target in seen:
                            raise FetchError(f"redirect loop: {url[:200]} redirects back to {target[:200]}")
                        url = target
                        continue
                    return await self._read(url, response)
            except httpx.TimeoutException as error:
                raise ToolTimeoutError(f"the page {url[:200]} did not answer in time") from error
            except httpx.HTTPError as error:
                raise ServiceUnavailableError(f"cannot load {url[:200]}: {type(error).__name__}: {error}") from error
        raise FetchError(
            f"more than {self.max_redirects} redirects starting from the requested URL (last: {url[:200]})"
        )

    async def _read(self, url: str, response: httpx.Response) -> FetchedPage:
        if response.status_code >= 400:
            raise FetchError(f"the page {url[:200]} answered HTTP {response.status_code}")
        body = bytearray()
        truncated = False
        async for chunk in response.aiter_bytes():
            body.extend(chunk)
            if len(body) >= self.max_bytes:
                truncated = len(body) > self.max_bytes or not response.is_stream_consumed
                del body[self.max_bytes :]
                break
        content_type, _, params = response.headers.get("content-type", "").partition(";")
        charset = None
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.lower() == "charset" and value:
                charset = value.strip("\"' ")
        return FetchedPage(
            url=url,
            status=response.status_code,
            content_type=content_type.strip().lower(),
            charset=charset,
            body=bytes(body),
            truncated=truncated,
        )

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                follow_redirects=False,
                timeout=self.timeout_s,
                headers={
                    "User-Agent": USER_AGENT,
                    "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
                },
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
