"""Fetch one web page safely: http(s) only, no private addresses unless allowed, capped size and time.

Redirects are followed by hand so that every hop is checked against the same
address policy (a public page must not redirect the fetcher into the local
network) and loops are caught. The body is streamed and cut at ``max_bytes``, so
a 50 MB page costs at most ``max_bytes`` of memory.

The address check happens where the connection is made (`CheckedNetworkBackend`): the host is
resolved once, every address is checked, and the socket connects to a checked address while the
request keeps the original Host header and TLS server name. Resolving twice (once to check, once to
connect) would let a hostile DNS server answer a public address to the check and a loopback one to
the connection (DNS rebinding).

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
from collections.abc import Awaitable, Callable, Iterable

import httpcore
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


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix: the last 32 bits are the IPv4 host
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215's local-use prefix: internal by definition
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765's SIIT form
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # the deprecated ::a.b.c.d form


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to: IPv4-mapped, IPv4-compatible, SIIT, NAT64, 6to4, Teredo.

    Example:
        >>> nat64, six_to_four = ipaddress.IPv6Address("64:ff9b::7f00:1"), ipaddress.IPv6Address("2002:a00:1::")
        >>> embedded_ipv4(nat64), embedded_ipv4(six_to_four)
        ([IPv4Address('127.0.0.1')], [IPv4Address('10.0.0.1')])
    """
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    embedded = []
    if ip.ipv4_mapped is not None:
        embedded.append(ip.ipv4_mapped)
    if any(ip in network for network in (_NAT64, _IPV4_TRANSLATED, _IPV4_COMPATIBLE)):
        embedded.append(low32)
    if ip.sixtofour is not None:
        embedded.append(ip.sixtofour)
    if ip.teredo is not None:
        embedded.extend(ip.teredo)
    return embedded


def _is_internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:
            return True
        if any(not v4.is_global or v4.is_multicast for v4 in embedded_ipv4(ip)):
            return True
    return not ip.is_global or ip.is_multicast


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``, with the default port made explicit (for allow-lists)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


Resolver = Callable[[str, int], Awaitable[list[str]]]
"""An async ``(host, port) -> addresses`` function; tests inject one to play a hostile DNS server."""


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives for ``host``."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ServiceUnavailableError(f"cannot resolve the host {host!r}: {error}") from error
    return list(dict.fromkeys(info[4][0] for info in infos))


def _literal_address(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class CheckedNetworkBackend(httpcore.AsyncNetworkBackend):
    """Opens connections only to addresses that pass the address policy, and to exactly those addresses.

    Args:
        resolver: Turns a host name into addresses (`system_resolver` by default).
        allow_private: Allow internal addresses for every host.
        allowed_endpoints: ``(host, port)`` pairs allowed even when internal.
    """

    def __init__(self, resolver: Resolver, allow_private: bool, allowed_endpoints: Iterable[tuple[str, int]]):
        self.resolver = resolver
        self.allow_private = allow_private
        self.allowed_endpoints = frozenset(allowed_endpoints)
        self._backend = httpcore.AnyIOBackend()

    async def addresses(self, host: str, port: int) -> list[str]:
        """The checked addresses of ``host``; raises `BlockedAddressError` when any of them is refused."""
        literal = _literal_address(host)
        addresses = [literal] if literal is not None else await self.resolver(host, port)
        if not addresses:
            raise ServiceUnavailableError(f"the host {host!r} has no address")
        if self.allow_private or (host.lower(), port) in self.allowed_endpoints:
            return addresses
        for address in addresses:
            if _is_internal(address):
                raise BlockedAddressError(
                    f"refusing to browse {host!r}: it resolves to the internal address {address} "
                    "(private and loopback addresses are not allowed here)"
                )
        return addresses

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        failure: Exception | None = None
        for address in await self.addresses(host, port):
            try:
                return await self._backend.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                failure = error  # try the next checked address, as a resolver-driven connect would
        raise failure

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise BlockedAddressError("pages are fetched over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class PageFetcher:
    """Fetches pages with httpx under the limits below.

    Args:
        max_bytes: Largest body kept; longer bodies are cut (and marked truncated).
        timeout_s: Time limit for the whole fetch, redirects included.
        max_redirects: Redirect hops followed before giving up.
        allow_private: Allow private, loopback and link-local addresses (tests, local mirrors).
        allowed_origins: Origins (``http://127.0.0.1:8000``) allowed even when internal, e.g. the offline site,
            without opening the rest of the local network (matched by host and port, where connections are made).
        resolver: Host name -> addresses (`system_resolver` by default).
    """

    def __init__(
        self,
        max_bytes: int = 2_000_000,
        timeout_s: float = 15.0,
        max_redirects: int = 5,
        allow_private: bool = False,
        allowed_origins: tuple[str, ...] = (),
        resolver: Resolver = system_resolver,
    ):
        if max_bytes < 1 or timeout_s <= 0 or max_redirects < 0:
            raise ValueError("max_bytes and timeout_s must be positive and max_redirects >= 0")
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self.allow_private = allow_private
        self.allowed_origins = frozenset(origin_of(origin) for origin in allowed_origins)
        endpoints = {(urllib.parse.urlsplit(origin).hostname, urllib.parse.urlsplit(origin).port)
                     for origin in self.allowed_origins}
        self._backend = CheckedNetworkBackend(resolver, allow_private, endpoints)
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
            check_url(url)  # the address policy is applied by the backend, at the moment it connects
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
        return FetchedPage(
            url=url,
            status=response.status_code,
            content_type=response.headers.get("content-type", "").partition(";")[0].strip().lower(),
            charset=response.charset_encoding,
            body=bytes(body),
            truncated=truncated,
        )

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            transport = httpx.AsyncHTTPTransport()
            # httpx has no network_backend option: give its transport a pool that connects through the checked
            # backend (same TLS context, so the certificate is still verified against the URL's host name).
            transport._pool = httpcore.AsyncConnectionPool(
                ssl_context=transport._pool._ssl_context, network_backend=self._backend
            )
            self._client = httpx.AsyncClient(
                transport=transport,
                trust_env=False,  # a proxy from the environment would connect to addresses nobody checked
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
