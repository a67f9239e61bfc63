"""`rapo_tools.serving` against greedy and slow clients, over loopback with real sockets: idle connections from a
few addresses cannot lock other addresses out, and answers that clients never read cannot pile up in the server.

(Every 127.0.0.x address reaches the loopback server on Linux: each is a client address of its own.)"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI, Response, WebSocket

from rapo_tools.serving import ConnectionLimits, serve_in_thread

MIB = 1 << 20


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict:
        return {"pong": True}

    @app.get("/big")
    def big(mib: int) -> Response:
        return Response(b"x" * (mib * MIB), media_type="application/octet-stream")

    return app


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _ping_from(url: str, address: str) -> int:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30) as client:
        return client.get(f"{url}/ping").status_code


def test_idle_connections_from_a_few_addresses_cannot_lock_a_new_address_out():
    # The red team: 2,250 idle connections from 5 addresses, each under the per-address cap, got everyone 503.
    limits = ConnectionLimits(header_timeout_s=60, max_connections=40, max_connections_per_client=10)
    with serve_in_thread(_app(), connection_limits=limits) as url:
        hogs = [socket.create_connection(_address(url), source_address=(f"127.0.0.{2 + i // 10}", 0))
                for i in range(50)]  # 5 addresses x 10: more than the server holds
        try:
            time.sleep(0.2)  # the server has seen every connection
            assert _ping_from(url, "127.0.0.7") == 200  # a new address is served ...
            assert _ping_from(url, "127.0.0.1") == 200  # ... and so is the usual one
        finally:
            for sock in hogs:
                sock.close()


def test_a_client_never_gets_more_than_its_share_by_evicting():
    # Eviction takes from the biggest holder only while it holds more than the newcomer would.
    limits = ConnectionLimits(header_timeout_s=60, max_connections=4, max_connections_per_client=4)
    with serve_in_thread(_app(), connection_limits=limits) as url:
        pair = [socket.create_connection(_address(url), source_address=(f"127.0.0.{2 + i}", 0)) for i in range(2)]
        more = [socket.create_connection(_address(url), source_address=(f"127.0.0.{2 + i}", 0)) for i in range(2)]
        late = socket.create_connection(_address(url), source_address=("127.0.0.2", 0))
        late.settimeout(10)
        try:
            assert late.recv(4096).startswith(b"HTTP/1.1 503")  # 127.0.0.2 already holds its fair half
        finally:
            for sock in [*pair, *more, late]:
                sock.close()


def _request_and_never_read(url: str, mib: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # the kernel takes little off the server
    sock.connect(_address(url))
    sock.sendall(f"GET /big?mib={mib} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    sock.settimeout(60)
    assert sock.recv(1, socket.MSG_PEEK)  # the answer has started: the server is writing it
    return sock


def _read_body(sock: socket.socket) -> int:
    """Bytes of body received before the connection ended (a cut connection ends early)."""
    data = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
            head, _, body = bytes(data).partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), None)
            if length is not None and len(body) >= length:
                return len(body)
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    return len(bytes(data).partition(b"\r\n\r\n")[2])


def test_unread_answers_are_cut_once_they_pass_the_queued_bytes_cap():
    # The red team: 40 clients that never read their ~16 MB answers held about 660 MiB of the server's memory.
    limits = ConnectionLimits(max_queued_response_bytes=24 * MIB, write_timeout_s=120)
    with serve_in_thread(_app(), connection_limits=limits) as url:
        readers = [_request_and_never_read(url, 8) for _ in range(10)]
        time.sleep(0.5)
        assert _ping_from(url, "127.0.0.1") == 200
        received = [_read_body(sock) for sock in readers]
    complete = sum(size == 8 * MIB for size in received)
    assert complete < 10, received  # some were cut ...
    assert complete >= 1, received  # ... not all: the cap holds what fits


def test_an_answer_left_unread_past_the_write_timeout_is_cut():
    limits = ConnectionLimits(write_timeout_s=1.0)
    with serve_in_thread(_app(), connection_limits=limits) as url:
        slow = _request_and_never_read(url, 16)
        patient = _request_and_never_read(url, 16)
        patient.settimeout(60)
        patient_body = _read_body(patient)  # read at once: it is never cut
        time.sleep(3)  # the slow one reads nothing for longer than the write timeout
        slow_body = _read_body(slow)
        assert _ping_from(url, "127.0.0.1") == 200
    assert patient_body == 16 * MIB
    assert slow_body < 16 * MIB


@pytest.mark.parametrize("field", ["write_timeout_s", "max_queued_response_bytes"])
def test_the_new_limits_must_be_positive(field):
    with pytest.raises(ValueError):
        ConnectionLimits(**{field: 0})


def test_websocket_sessions_leave_the_guard():
    """An upgraded connection keeps no request-head timer (a session may idle past it) and no longer counts toward
    the per-client cap (uvicorn's WebSocket protocol owns it; the app bounds its own sessions)."""
    import asyncio

    from websockets.asyncio.client import connect

    app = FastAPI()

    @app.websocket("/echo")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            await websocket.send_text(await websocket.receive_text())

    async def sessions(url: str) -> list[str]:
        sockets = [await connect(url.replace("http", "ws") + "/echo") for _ in range(4)]
        await asyncio.sleep(1.0)  # past the head timeout below
        answers = []
        for index, ws in enumerate(sockets):
            await ws.send(str(index))
            answers.append(await ws.recv())
        for ws in sockets:
            await ws.close()
        return answers

    limits = ConnectionLimits(header_timeout_s=0.3, max_connections_per_client=2)
    with serve_in_thread(app, connection_limits=limits) as url:
        assert asyncio.run(sessions(url)) == ["0", "1", "2", "3"]
        assert httpx.get(f"{url}/ping").status_code == 404  # plain HTTP still admitted: the sessions left the guard
