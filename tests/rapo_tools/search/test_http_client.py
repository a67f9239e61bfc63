"""RetryingClient and serve_in_thread against real uvicorn servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import socket
import time

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from rapo_tools.aio import run_sync
from rapo_tools.base import BadToolInputError, ServiceUnavailableError, ToolTimeoutError
from rapo_tools.http_client import RetryingClient, RetryPolicy, retry_after_listener, retry_after_s
from rapo_tools.serving import ServerStartError, serve_in_thread


def _flaky_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = {"flaky": 0, "busy": 0, "generate": 0, "slow": 0, "patient": [], "away": 0}

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
        app.state.calls["slow"] += 1
        await asyncio.sleep(2.0)
        return {"late": True}

    @app.post("/generate")
    async def generate():
        app.state.calls["generate"] += 1
        await asyncio.sleep(2.0)
        return {"late": True}

    @app.get("/patient")
    async def patient():
        app.state.calls["patient"].append(time.monotonic())
        if len(app.state.calls["patient"]) == 1:
            return JSONResponse({"detail": "slow down"}, status_code=429, headers={"Retry-After": "1"})
        return {"served": True}

    @app.get("/away")
    async def away():
        app.state.calls["away"] += 1
        return JSONResponse({"detail": "maintenance"}, status_code=503, headers={"Retry-After": "3600"})

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


def test_a_post_that_timed_out_is_not_sent_again_but_a_get_is(flaky_server):
    url, app = flaky_server
    client = RetryingClient(url, timeout_s=0.2, retries=2, backoff_s=0.01)
    with pytest.raises(ToolTimeoutError):
        _call(client, client.post_json("/generate", {}))
    assert app.state.calls["generate"] == 1  # the server may still be working on it: never twice
    before = app.state.calls["slow"]
    with pytest.raises(ToolTimeoutError):
        _call(client, client.get_json("/slow"))
    assert app.state.calls["slow"] - before == 3  # idempotent: retried


def test_retry_after_is_honoured(flaky_server):
    url, app = flaky_server
    client = RetryingClient(url, retries=2, backoff_s=0.01)
    heard = []

    async def listened():
        retry_after_listener.set(heard.append)  # what the search tool does to pause its rate budget
        return await client.get_json("/patient")

    assert _call(client, listened()) == {"served": True}
    first, second = app.state.calls["patient"]
    assert second - first >= 0.9  # the server's one second, not the 0.01 s back-off
    assert heard == [1.0]


def test_a_retry_after_beyond_the_cap_is_not_waited_for(flaky_server):
    url, app = flaky_server
    client = RetryingClient(url, retries=3, backoff_s=0.01)
    with pytest.raises(ServiceUnavailableError, match="503.*maintenance"):
        _call(client, client.get_json("/away"))
    assert app.state.calls["away"] == 1


def test_retry_after_reads_seconds_and_http_dates():
    def answer(value):
        return httpx.Response(429, headers={"Retry-After": value} if value is not None else {})

    assert retry_after_s(answer("7")) == 7.0
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 <= retry_after_s(answer(in_a_minute)) <= 60
    assert retry_after_s(answer("soon")) is None and retry_after_s(answer(None)) is None
    assert RetryPolicy(max_retry_after_s=5).delay_s(1, answer("7")) is None
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)
