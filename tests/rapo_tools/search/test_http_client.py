"""RetryingClient and serve_in_thread against real uvicorn servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
from fastapi import FastAPI, HTTPException

from rapo_tools.aio import run_sync
from rapo_tools.base import BadToolInputError, ServiceUnavailableError, ToolTimeoutError
from rapo_tools.http_client import RetryingClient
from rapo_tools.serving import ServerStartError, serve_in_thread


def _flaky_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = {"flaky": 0, "busy": 0}

    @app.post("/flaky")
    async def flaky(payload: dict):
        app.state.calls["flaky"] += 1
        if app.state.calls["flaky"] <= 2:
            raise HTTPException(503, "warming up")
        return {"echo": payload}

    @app.get("/busy")
    async def busy():
        app.state.calls["busy"] += 1
        raise HTTPException(429, "slow down")

    @app.post("/reject")
    async def reject():
        raise HTTPException(400, "the query is empty")

    @app.get("/slow")
    async def slow():
        await asyncio.sleep(2.0)
        return {"late": True}

    @app.get("/not-json")
    async def not_json():
        from fastapi.responses import PlainTextResponse

        return PlainTextResponse("plain text")

    return app


@pytest.fixture(scope="module")
def flaky_server():
    app = _flaky_app()
    with serve_in_thread(app) as url:
        yield url, app


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _call(client: RetryingClient, coro):
    try:
        return run_sync(coro)
    finally:
        run_sync(client.aclose())


def test_serve_in_thread_answers_and_stops():
    app = FastAPI()

    @app.get("/ping")
    async def ping():
        return {"pong": True}

    with serve_in_thread(app) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/ping").json() == {"pong": True}
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/ping", timeout=1.0)


def test_serve_in_thread_reports_a_failed_startup():
    @contextlib.asynccontextmanager
    async def broken(app):
        raise RuntimeError("cannot open the index")
        yield

    with pytest.raises(ServerStartError):
        with serve_in_thread(FastAPI(lifespan=broken), startup_timeout_s=10):
            pass


def test_5xx_is_retried_until_success(flaky_server):
    url, app = flaky_server
    client = RetryingClient(url, retries=3, backoff_s=0.01)
    assert _call(client, client.post_json("/flaky", {"q": 1})) == {"echo": {"q": 1}}
    assert app.state.calls["flaky"] == 3


def test_429_exhausts_retries_into_service_unavailable(flaky_server):
    url, app = flaky_server
    client = RetryingClient(url, retries=2, backoff_s=0.01)
    with pytest.raises(ServiceUnavailableError, match="429.*slow down.*3 attempts"):
        _call(client, client.get_json("/busy"))
    assert app.state.calls["busy"] == 3


def test_4xx_is_not_retried_and_carries_the_server_message(flaky_server):
    url, _ = flaky_server
    client = RetryingClient(url, retries=3, backoff_s=0.01)
    with pytest.raises(BadToolInputError, match="400.*the query is empty"):
        _call(client, client.post_json("/reject", {}))


def test_slow_answer_is_a_timeout_and_non_json_is_unavailable(flaky_server):
    url, _ = flaky_server
    client = RetryingClient(url, timeout_s=0.2, retries=3, backoff_s=0.01)
    with pytest.raises(ToolTimeoutError, match="0.2 s"):
        _call(client, client.get_json("/slow"))
    client = RetryingClient(url, retries=0)
    with pytest.raises(ServiceUnavailableError, match="invalid JSON"):
        _call(client, client.get_json("/not-json"))


def test_dead_service_is_unavailable_after_retries():
    client = RetryingClient(f"http://127.0.0.1:{_free_port()}", timeout_s=1.0, retries=2, backoff_s=0.01)
    with pytest.raises(ServiceUnavailableError, match="cannot reach.*3 attempts"):
        _call(client, client.get_json("/health"))


def test_bad_client_settings_raise():
    with pytest.raises(ValueError):
        RetryingClient("http://127.0.0.1:1", timeout_s=0)
    with pytest.raises(ValueError):
        RetryingClient("http://127.0.0.1:1", retries=-1)
