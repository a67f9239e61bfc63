"""Run FastAPI apps under uvicorn: blocking (scripts) or in a background thread (tests, notebooks).

`serve_in_thread` binds (port 0 picks a free port), waits until the server answers
HTTP and yields its base URL; leaving the ``with`` block shuts the server down.

Both guard the server's connections against slow and greedy clients (`ConnectionLimits`): a
connection that has not sent a complete request head within ``header_timeout_s`` of opening (or of
the first bytes of its next request) gets 408 and is closed, a client holding more than ``max_connections_per_client``
connections gets 503 on the next ones, and the whole server holds at most ``max_connections``, shared fairly:
when it is full, a client holding fewer than the biggest holder gets a connection by closing one of that
holder's idle ones (so idle connections from a few addresses cannot lock everyone else out). Answers that
clients do not read are bounded too: a connection whose client reads nothing for ``write_timeout_s`` is cut,
and so is the newest one that would take the unread answers of all connections past ``max_queued_response_bytes``.

Example:
    >>> import httpx
    >>> from fastapi import FastAPI
    >>> app = FastAPI()
    >>> @app.get("/ping")
    ... def ping():
    ...     return {"pong": True}
    >>> with serve_in_thread(app) as base_url:
    ...     httpx.get(f"{base_url}/ping").json()
    {'pong': True}
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import uvicorn

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The server did not start (bad host, port in use, app failed at startup) or never answered."""


@dataclasses.dataclass
class ConnectionLimits:
    """What one client may hold of a server's connections (enforced below the ASGI app, per connection)."""

    header_timeout_s: float = 10.0
    """Time for a request head (request line and headers) to arrive, from the connection's opening or from the
    first bytes of a next request; beyond it the client gets 408 and the connection closes."""
    keep_alive_s: float = 5.0
    """An idle keep-alive connection closes after this long (uvicorn's ``timeout_keep_alive``)."""
    max_connections_per_client: int = 512
    """Open connections per client address; the next ones get 503 and are closed at once."""
    max_connections: int = 2048
    """Open connections in all, shared fairly between client addresses: when the server holds this many, a new
    connection closes an idle one of the biggest holder (while it holds more than the newcomer would), else it
    gets 503."""
    max_header_bytes: int = 64 * 1024
    """Largest request head (uvicorn's ``h11_max_incomplete_event_size``; httptools has its own 80 KiB limit)."""
    write_timeout_s: float = 30.0
    """How long an answer may wait unread, its client reading nothing of it (while the server's buffer is above
    its high-water mark); beyond it the connection is cut and its buffer freed."""
    max_queued_response_bytes: int = 256 << 20
    """Bytes of answers that clients have not read yet, over all connections; a connection that would pass it
    is cut (its answer dropped) instead."""

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.keep_alive_s <= 0 or self.write_timeout_s <= 0:
            raise ValueError("ConnectionLimits timeouts must be positive")
        if self.max_connections_per_client < 1 or self.max_connections < 1 or self.max_queued_response_bytes < 1:
            raise ValueError("ConnectionLimits connection counts and byte caps must be >= 1")


def _plain_answer(status: str, message: str) -> bytes:
    body = message.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Connections:
    """The connections one server holds, per client address: what the guard counts and evicts from."""

    def __init__(self) -> None:
        self.by_client: dict[str, set[Any]] = collections.defaultdict(set)
        self.total = 0
        self.unread: set[Any] = set()  # connections whose answers wait above the high-water mark

    def add(self, connection: Any) -> None:
        self.by_client[connection.guard_client].add(connection)
        self.total += 1

    def discard(self, connection: Any) -> None:
        held = self.by_client.get(connection.guard_client)
        if held is not None and connection in held:
            held.discard(connection)
            self.total -= 1
            if not held:
                del self.by_client[connection.guard_client]
        self.unread.discard(connection)

    def held_by(self, client: str) -> int:
        return len(self.by_client.get(client, ()))

    def evict_for(self, client: str) -> bool:
        """Close an idle connection of the biggest holder to make room for ``client``, if it holds more than
        ``client`` would; True when one was closed."""
        mine = self.held_by(client) + 1
        for held in sorted(self.by_client.values(), key=len, reverse=True):
            if len(held) <= mine:
                return False
            idle = next((connection for connection in held if connection.guard_idle()), None)
            if idle is not None:
                idle.guard_close(b"")
                return True
        return False

    def queued_bytes(self) -> int:
        return sum(connection.transport.get_write_buffer_size() for connection in self.unread)


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) with a request-head timeout, a fair connection cap and
    bounds on unread answers. A connection upgraded to a WebSocket leaves the guard: it lasts as long as the app
    keeps it.

    Each call makes a class with its own connection bookkeeping: one per server.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    connections = _Connections()
    refused = _plain_answer(
        "503 Service Unavailable", f"too many connections from this client (limit {limits.max_connections_per_client})"
    )
    full = _plain_answer("503 Service Unavailable", f"the server holds its limit of {limits.max_connections} "
                         "connections, none of them idle")
    too_slow = _plain_answer("408 Request Timeout", f"no complete request head within {limits.header_timeout_s:g} s")

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.guard_client = self.client[0] if self.client else ""
            self._head_timer: asyncio.TimerHandle | None = None
            self._write_timer: asyncio.TimerHandle | None = None
            if connections.held_by(self.guard_client) >= limits.max_connections_per_client:
                self.guard_close(refused)
                return
            if connections.total >= limits.max_connections and not connections.evict_for(self.guard_client):
                self.guard_close(full)
                return
            connections.add(self)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timers()
            connections.discard(self)
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # uvicorn hands the transport to its WebSocket protocol, so this one never sees the connection close:
            # it leaves the guard here (no head timer, not counted); a WebSocket app bounds its own sessions.
            connections.discard(self)
            self._stop_timers()
            super().handle_websocket_upgrade(*args)

        def guard_idle(self) -> bool:
            """No request of this connection is being answered (between requests, or no complete head yet)."""
            return self.cycle is None or self.cycle.response_complete

        def guard_close(self, answer: bytes, abort: bool = False) -> None:
            """Stop counting this connection and close it (``answer`` first, unless it is cut: ``abort``)."""
            connections.discard(self)
            self._stop_timers()
            if abort:
                self.transport.abort()  # drops what is queued: that memory is freed now
            elif not self.transport.is_closing():
                if answer:
                    self.transport.write(answer)
                self.transport.close()

        def _stop_timers(self) -> None:
            for timer in (self._head_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._write_timer = None

        def data_received(self, data: bytes) -> None:
            # The first bytes of a next request on a kept-alive connection start its head's clock (while it
            # sits idle, uvicorn's keep-alive timeout closes it quietly).
            if self._head_timer is None and self.guard_idle() and not self.transport.is_closing():
                self._await_head()
            super().data_received(data)

        def on_response_complete(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_response_complete()

        def pause_writing(self) -> None:
            # The client is not reading as fast as we answer: its answer now waits in our buffer.
            super().pause_writing()
            connections.unread.add(self)
            if connections.queued_bytes() > limits.max_queued_response_bytes:
                logger.warning("cut a connection from %s: unread answers passed %d bytes", self.guard_client,
                               limits.max_queued_response_bytes)
                self.guard_close(b"", abort=True)
                return
            if self._write_timer is None:
                self._await_reader()

        def resume_writing(self) -> None:
            connections.unread.discard(self)
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().resume_writing()

        def _await_reader(self) -> None:
            queued = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(limits.write_timeout_s, self._write_deadline, queued)

        def _write_deadline(self, queued_before: int) -> None:
            self._write_timer = None
            if self.transport.get_write_buffer_size() < queued_before:
                self._await_reader()  # the client reads, if slowly: give it another period
                return
            logger.warning("cut a connection from %s: its answer waited unread for %g s", self.guard_client,
                           limits.write_timeout_s)
            self.guard_close(b"", abort=True)

        def _await_head(self) -> None:
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_deadline, self.cycle)

        def _head_deadline(self, waiting_cycle: Any) -> None:
            self._head_timer = None
            # uvicorn makes a new cycle once a request head is complete; the same finished cycle means none came.
            if self.cycle is waiting_cycle and self.guard_idle() and not self.transport.is_closing():
                self.guard_close(too_slow)

    return GuardedHTTPProtocol


def add_connection_arguments(parser: Any) -> None:
    """The `ConnectionLimits` flags of the ``serve`` commands."""
    defaults = ConnectionLimits()
    parser.add_argument(
        "--header_timeout",
        type=float,
        default=defaults.header_timeout_s,
        help="seconds a connection may take to send a request head (408 and closed beyond)",
    )
    parser.add_argument(
        "--max_connections_per_client",
        type=int,
        default=defaults.max_connections_per_client,
        help="open connections per client address (503 beyond)",
    )


def connection_limits(args: Any) -> ConnectionLimits:
    """`ConnectionLimits` from the flags of `add_connection_arguments`."""
    return ConnectionLimits(
        header_timeout_s=args.header_timeout, max_connections_per_client=args.max_connections_per_client
    )


def _uvicorn_config(app: Any, host: str, port: int, log_level: str, limits: ConnectionLimits | None) -> uvicorn.Config:
    limits = limits or ConnectionLimits()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,
        # The guard admits at most max_connections; uvicorn's own cap (503 for every request beyond it, whoever
        # holds the connections) only backs it up, counting connections the guard is closing.
        limit_concurrency=2 * limits.max_connections + 16,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    connection_limits: ConnectionLimits | None = None,
) -> None:
    """Serve ``app`` until interrupted (Ctrl-C); for the command-line entry points."""
    uvicorn.Server(_uvicorn_config(app, host, port, log_level, connection_limits)).run()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a server that cannot bind port 0 itself (a subprocess,
    Ray Serve)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bound_port(server: uvicorn.Server) -> int:
    for listener in server.servers:
        for sock in listener.sockets:
            return int(sock.getsockname()[1])
    raise ServerStartError("uvicorn reported started but holds no listening socket")


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout_s: float = 30.0,
    log_level: str = "warning",
    connection_limits: ConnectionLimits | None = None,
) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread and yield ``"http://host:port"`` once it answers.

    Args:
        app: An ASGI application (FastAPI).
        host: Interface to bind; keep the loopback default unless the server must be reachable.
        port: Port to bind; 0 lets the OS pick a free one (the yielded URL has the real port).
        startup_timeout_s: How long to wait for the server to answer before giving up.
        log_level: uvicorn's log level.
        connection_limits: Slow- and greedy-client guards; defaults to `ConnectionLimits()`.

    Raises:
        ServerStartError: when the server exits during startup or does not answer in time.
    """
    server = uvicorn.Server(_uvicorn_config(app, host, port, log_level, connection_limits))

    def run_server() -> None:
        try:
            server.run()
        except SystemExit:  # uvicorn exits on a failed startup; the waiting caller reports it
            logger.error("uvicorn exited during startup on %s:%d", host, port)

    thread = threading.Thread(target=run_server, name=f"uvicorn-{host}:{port}", daemon=True)
    thread.start()
    try:
        base_url = _wait_until_answering(server, thread, host, startup_timeout_s)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        if thread.is_alive():
            # A stuck request must not hang the caller's shutdown forever.
            server.force_exit = True
            thread.join(timeout=5.0)


def _wait_until_answering(server: uvicorn.Server, thread: threading.Thread, host: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise ServerStartError(f"uvicorn exited during startup on {host} (port in use or app startup failed)")
        if time.monotonic() > deadline:
            raise ServerStartError(f"uvicorn did not start within {timeout_s:.0f} s")
        time.sleep(0.01)
    url_host = f"[{host}]" if ":" in host else host
    base_url = f"http://{url_host}:{_bound_port(server)}"
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                client.get(f"{base_url}/")  # any HTTP answer (even 404) proves the server is serving
                return base_url
            except httpx.TransportError as error:
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"the server at {base_url} did not answer within {timeout_s:.0f} s"
                    ) from error
                time.sleep(0.02)


@contextlib.contextmanager
def serve_command(command: Sequence[str], port: int, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """Run a server command (``rapo search serve ...``, a script) listening on ``port`` on loopback; yield its URL
    once ``/health`` answers, and stop it on leaving.

    Raises:
        ServerStartError: when the command exits first (its output's end is in the message) or never answers.
    """
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        list(command),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise ServerStartError(f"{' '.join(command[:4])} exited:\n{log.read().decode()[-2000:]}")
            try:
                httpx.get(f"{url}/health", timeout=2.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{' '.join(command[:4])} did not answer within {startup_timeout_s:.0f} s"
                    ) from None
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
