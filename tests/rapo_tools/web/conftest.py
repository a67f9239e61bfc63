"""A real loopback web for the web-tool tests: HTML pages, hostile pages, search APIs and a chat endpoint.

Everything is served by one FastAPI app under uvicorn on 127.0.0.1 (`rapo_tools.serving.serve_in_thread`):

- ``/pages/{slug}``: small HTML articles; ``/plain``: text/plain; ``/redirect``: one 302 hop;
- ``/big``: a 50 MB HTML page, streamed; ``/slow``: a page that trickles for 30 s;
- ``/binary`` (image/png) and ``/octets`` (untyped NUL bytes); ``/loop/a`` <-> ``/loop/b``: a redirect loop;
- ``/v7.0/search``: the Bing v7 JSON, key checked; ``/flaky/v7.0/search``: 500 twice per query, then 200;
  ``/down/v7.0/search``: always 503; ``/throttled/v7.0/search``: its first request ever gets a 429 with
  ``Retry-After: 1``; ``/res/v1/web/search``: the Brave JSON;
- ``/v1/chat/completions``: an OpenAI-compatible chat endpoint whose rule-based "model" summarises pages.
"""

# No `from __future__ import annotations`: FastAPI must see the real types of the route parameters.

import asyncio
import collections
import re

import pytest

BING_KEY = "test-bing-key"
BRAVE_KEY = "test-brave-key"
PAGES = {
    "ada": (
        "Ada Lovelace",
        "Ada Lovelace was an English mathematician and writer. She is chiefly known for her work on "
        "Charles Babbage's proposed mechanical general-purpose computer, the Analytical Engine. "
        "She was born in London in 1815.",
    ),
    "babbage": (
        "Charles Babbage",
        "Charles Babbage was an English polymath who originated the concept of a digital "
        "programmable computer. He designed the Difference Engine and the Analytical Engine.",
    ),
    "nile": (
        "Nile",
        "The Nile is a major north-flowing river in northeastern Africa. It flows into the Mediterranean Sea "
        "and is about 6,650 km long.",
    ),
}


def page_html(slug: str) -> str:
    title, text = PAGES[slug]
    sentences = "".join(f"<p>{sentence.strip()}.</p>" for sentence in text.split(". ") if sentence.strip())
    links = "".join(f'<li><a href="/pages/{other}">{PAGES[other][0]}</a></li>' for other in PAGES if other != slug)
    return (
        f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
        f"<nav><a href='/'>Home</a> | <a href='/about'>About us</a> | <a href='/contact'>Contact</a></nav>"
        f"<article><h1>{title}</h1>{sentences}<h2>Related</h2><ul>{links}</ul></article>"
        "<footer>Copyright Test Wiki. Cookie settings. Privacy policy.</footer></body></html>"
    )


def _matches(query: str) -> list[str]:
    words = set(re.findall(r"\w+", query.lower()))
    scored = [
        (len(words & set(re.findall(r"\w+", (title + " " + text).lower()))), slug)
        for slug, (title, text) in PAGES.items()
    ]
    return [slug for score, slug in sorted(scored, reverse=True) if score > 0]


def build_test_web_app():
    from fastapi import FastAPI, Header, HTTPException, Request
    from fastapi.responses import (
        HTMLResponse,
        JSONResponse,
        PlainTextResponse,
        RedirectResponse,
        Response,
        StreamingResponse,
    )

    app = FastAPI()
    app.state.search_requests = collections.Counter()
    app.state.flaky_failures = collections.Counter()
    app.state.throttled = []
    app.state.chat_requests = []

    @app.get("/pages/{slug}", response_class=HTMLResponse)
    def page(slug: str) -> str:
        if slug not in PAGES:
            raise HTTPException(404, "no such page")
        return page_html(slug)

    @app.get("/plain", response_class=PlainTextResponse)
    def plain() -> str:
        return "Plain facts: the Nile is about 6,650 km long."

    @app.get("/redirect")
    def redirect() -> RedirectResponse:
        return RedirectResponse("/pages/ada", status_code=302)

    @app.get("/loop/a")
    def loop_a() -> RedirectResponse:
        return RedirectResponse("/loop/b", status_code=302)

    @app.get("/loop/b")
    def loop_b() -> RedirectResponse:
        return RedirectResponse("/loop/a", status_code=302)

    @app.get("/big")
    def big() -> StreamingResponse:
        chunk = ("<p>" + "filler text about nothing in particular " * 25 + "</p>\n").encode()

        def body():
            yield b"<!DOCTYPE html><html><head><title>Huge page</title></head><body><h1>Huge page</h1>"
            yield b"<p>The first paragraph says the secret number is 4242.</p>"
            for _ in range(50 * 1024 * 1024 // len(chunk)):
                yield chunk
            yield b"</body></html>"

        return StreamingResponse(body(), media_type="text/html")

    @app.get("/slow")
    async def slow() -> StreamingResponse:
        async def body():
            yield b"<html><body><p>Slow start</p>"
            for _ in range(60):
                await asyncio.sleep(0.5)
                yield b"<p>more</p>"

        return StreamingResponse(body(), media_type="text/html")

    @app.get("/binary")
    def binary() -> Response:
        return Response(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40, media_type="image/png")

    @app.get("/octets")
    def octets() -> Response:
        return Response(b"\x00\x01\x02binary\x00" * 500, headers={"content-type": ""})

    def bing_answer(request: Request, q: str, count: int) -> dict:
        base = str(request.base_url).rstrip("/")
        values = [
            {
                "name": PAGES[slug][0],
                "url": f"{base}/pages/{slug}",
                "snippet": f"<b>{PAGES[slug][0]}</b>: {PAGES[slug][1][:120]}",
                "displayUrl": f"{base}/pages/{slug}",
            }
            for slug in _matches(q)[:count]
        ]
        return (
            {
                "_type": "SearchResponse",
                "queryContext": {"originalQuery": q},
                "webPages": {"totalEstimatedMatches": len(values), "value": values},
            }
            if values
            else {"_type": "SearchResponse"}
        )

    def check_key(key: str | None, expected: str) -> None:
        if key != expected:
            raise HTTPException(401, "Access denied due to invalid subscription key.")

    @app.get("/v7.0/search")
    def bing(request: Request, q: str, count: int = 10, ocp_apim_subscription_key: str | None = Header(None)) -> dict:
        check_key(ocp_apim_subscription_key, BING_KEY)
        app.state.search_requests[q] += 1
        return bing_answer(request, q, count)

    @app.get("/flaky/v7.0/search")
    def flaky(request: Request, q: str, count: int = 10, ocp_apim_subscription_key: str | None = Header(None)):
        check_key(ocp_apim_subscription_key, BING_KEY)
        app.state.search_requests[q] += 1
        if app.state.flaky_failures[q] < 2:
            app.state.flaky_failures[q] += 1
            return JSONResponse({"error": "backend overloaded"}, status_code=500)
        return bing_answer(request, q, count)

    @app.get("/throttled/v7.0/search")
    def throttled(request: Request, q: str, count: int = 10, ocp_apim_subscription_key: str | None = Header(None)):
        check_key(ocp_apim_subscription_key, BING_KEY)
        app.state.throttled.append(q)
        if len(app.state.throttled) == 1:
            return JSONResponse({"error": "rate limited"}, status_code=429, headers={"Retry-After": "1"})
        return bing_answer(request, q, count)

    @app.get("/down/v7.0/search")
    def down(q: str) -> JSONResponse:
        return JSONResponse({"error": "unavailable"}, status_code=503)

    @app.get("/res/v1/web/search")
    def brave(request: Request, q: str, count: int = 10, x_subscription_token: str | None = Header(None)) -> dict:
        check_key(x_subscription_token, BRAVE_KEY)
        base = str(request.base_url).rstrip("/")
        results = [
            {
                "title": PAGES[slug][0],
                "url": f"{base}/pages/{slug}",
                "description": f"About <strong>{PAGES[slug][0]}</strong>",
            }
            for slug in _matches(q)[:count]
        ]
        return {"type": "search", "web": {"type": "search", "results": results}}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        app.state.chat_requests.append(body)
        # A rule-based "summariser": keep the page sentences that share a word with the question.
        prompt = body["messages"][-1]["content"]
        question = re.search(r"Question: (.*)", prompt).group(1).lower()
        page = prompt.split("Page text:\n", 1)[1]
        keywords = set(re.findall(r"\w{4,}", question))
        relevant = [s for s in page.split(". ") if keywords & set(re.findall(r"\w{4,}", s.lower()))]
        reply = ". ".join(relevant) if relevant else "No relevant information."
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": body.get("model", "test"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
        }

    return app


@pytest.fixture(scope="session")
def test_web():
    """(base URL, app) of the loopback test web, for the whole session."""
    from rapo_tools.serving import serve_in_thread

    app = build_test_web_app()
    with serve_in_thread(app) as base_url:
        yield base_url, app


@pytest.fixture(scope="session")
def web_url(test_web) -> str:
    return test_web[0]


@pytest.fixture
def bing_key(monkeypatch) -> str:
    """The name of an environment variable holding the test Bing key."""
    monkeypatch.setenv("RAPO_TEST_BING_KEY", BING_KEY)
    return "RAPO_TEST_BING_KEY"


@pytest.fixture
def brave_key(monkeypatch) -> str:
    """The name of an environment variable holding the test Brave key."""
    monkeypatch.setenv("RAPO_TEST_BRAVE_KEY", BRAVE_KEY)
    return "RAPO_TEST_BRAVE_KEY"


class RawSite:
    """A bare ``http.server`` on loopback: answers ``routes[path]`` (status, headers, body; 404 for others) and
    records the Host header and path of every request in ``seen``."""

    def __init__(self):
        import http.server
        import threading

        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                site.seen.append((self.headers.get("Host", ""), self.path))
                status, headers, body = site.routes.get(self.path.partition("?")[0], (404, {}, b""))
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.seen: list[tuple[str, str]] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def raw_site():
    site = RawSite()
    yield site
    site.close()
