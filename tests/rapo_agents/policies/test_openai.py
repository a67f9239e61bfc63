"""OpenAIPolicy against rapo's OpenAI-compatible server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import torch

from rapo_agents.policies import SamplingParams
from rapo_agents.policies.openai import OpenAIPolicy
from rapo_agents.policies.openai_server import create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(tiny_policy):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(tiny_policy, "tiny"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("token_in", ["ids", "text"])
def test_openai_policy_matches_the_local_policy(tiny_policy, server_url, token_in):
    client = OpenAIPolicy(server_url, tokenizer=tiny_policy.tokenizer, token_in=token_in, concurrency=4)
    contexts = [tiny_policy.tokenizer.encode(text) for text in ("first prompt", "second, longer prompt", "3")]
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop=(), top_logprobs=5)
    try:
        remote = client.generate(contexts, params)
    finally:
        client.close()
    local = tiny_policy.generate(contexts, params)
    assert client.model == "tiny"
    for r, g in zip(remote, local, strict=True):
        assert r.token_ids == g.token_ids and r.text == g.text and r.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(r.logprobs), torch.tensor(g.logprobs), atol=1e-4, rtol=1e-4)
        assert r.entropy_kind == "top_k" and len(r.top_logprobs[0]) == 5


def test_stop_strings_are_kept_in_the_output(tiny_policy, server_url):
    context = tiny_policy.tokenizer.encode("<python>")
    free = tiny_policy.generate([context], SamplingParams(temperature=0.0, max_new_tokens=16, stop=()))[0]
    stop = free.text[4:6]
    client = OpenAIPolicy(server_url, tokenizer=tiny_policy.tokenizer)
    try:
        [cut] = client.generate([context], SamplingParams(temperature=0.0, max_new_tokens=16, stop=(stop,)))
    finally:
        client.close()
    assert cut.finish_reason == "stop" and cut.text.endswith(stop) and cut.stop_string == stop


def test_chat_models_and_bad_requests(server_url):
    chat = httpx.post(f"{server_url}/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "temperature": 0, "logprobs": True, "top_logprobs": 2}, timeout=30).json()
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and len(choice["logprobs"]["content"]) == 4
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2
    assert httpx.get(f"{server_url}/models").json()["data"][0]["id"] == "tiny"
    assert httpx.post(f"{server_url}/completions", json={"prompt": []}).status_code == 400
    assert httpx.post(f"{server_url}/completions", json={"prompt": [10**9]}).status_code == 400
    assert httpx.post(f"{server_url}/completions", json={"prompt": "x", "model": "other"}).status_code == 404
    assert httpx.post(f"{server_url}/completions", json={"prompt": "x", "top_p": 2}).status_code == 422


def test_a_dead_server_gives_error_generations_not_exceptions(tiny_policy):
    client = OpenAIPolicy(f"http://127.0.0.1:{free_port()}/v1", tokenizer=tiny_policy.tokenizer, max_retries=1,
                          backoff_s=0.01, timeout_s=2)
    try:
        [generation] = client.generate([[10, 11]], SamplingParams(max_new_tokens=4))
    finally:
        client.close()
    assert generation.finish_reason == "error" and "Connect" in generation.error and generation.token_ids == []


def _billing_server():
    """A completions endpoint that counts what it is sent: ``slow`` takes 2 s per generation, ``busy`` answers
    429 with ``Retry-After: 1`` once, then a completion."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    app.state.received = []

    @app.post("/{mode}/v1/completions")
    async def complete(mode: str):
        app.state.received.append((mode, time.monotonic()))
        if mode == "slow":
            await asyncio.sleep(2.0)
        if mode == "busy" and len(app.state.received) == 1:
            return JSONResponse({"error": "rate limited"}, status_code=429, headers={"Retry-After": "1"})
        return {"choices": [{"text": "ok", "finish_reason": "length"}]}

    return app


@pytest.fixture
def billing_server():
    from rapo_tools.serving import serve_in_thread

    app = _billing_server()
    with serve_in_thread(app) as url:
        yield url, app.state.received


def _generate(url: str, **options):
    from rapo_agents.policies import ByteTokenizer

    client = OpenAIPolicy(url, tokenizer=ByteTokenizer(), model="m", token_in="text", backoff_s=0.01, **options)
    try:
        return client.generate([[104, 105]], SamplingParams(max_new_tokens=2))[0]
    finally:
        client.close()


def test_a_timed_out_generation_is_not_sent_again(billing_server):
    url, received = billing_server
    generation = _generate(f"{url}/slow/v1", timeout_s=0.3, max_retries=3)
    assert generation.finish_reason == "error" and "Timeout" in generation.error
    assert len(received) == 1  # sent (and billed) once, although three retries were allowed


def test_429_is_retried_after_the_servers_retry_after(billing_server):
    url, received = billing_server
    generation = _generate(f"{url}/busy/v1", timeout_s=5.0, max_retries=2)
    assert generation.finish_reason == "length" and generation.text == "ok"
    assert len(received) == 2
    assert received[1][1] - received[0][1] >= 0.9  # waited as asked, not the 0.01 s back-off
