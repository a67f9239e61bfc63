"""Run FastAPI apps under uvicorn: blocking (scripts) or in a background thread (tests, notebooks).

`serve_in_thread` binds (port 0 picks a free port), waits until the server answers
HTTP and yields its base URL; leaving the ``with`` block shuts the server down.

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

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The server did not start (bad host, port in use, app failed at startup) or never answered."""


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve ``app`` until interrupted (Ctrl-C); for the command-line entry points."""
    uvicorn.run(app, host=host, port=port, log_level=log_level)


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
) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread and yield ``"http://host:port"`` once it answers.

    Args:
        app: An ASGI application (FastAPI).
        host: Interface to bind; keep the loopback default unless the server must be reachable.
        port: Port to bind; 0 lets the OS pick a free one (the yielded URL has the real port).
        startup_timeout_s: How long to wait for the server to answer before giving up.
        log_level: uvicorn's log level.

    Raises:
        ServerStartError: when the server exits during startup or does not answer in time.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
    server = uvicorn.Server(config)

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
