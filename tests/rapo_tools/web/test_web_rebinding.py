"""DNS rebinding: ``<browse>`` connects to the address it checked, on every hop, under a resolver we control.

The resolver plays a hostile DNS server: it answers a public address to the first question about a name
and loopback to every later one. A fetcher that resolves once to check and again to connect would reach
the loopback server below; rapo's must not.
"""

from __future__ import annotations

import http.server
import threading

import pytest

from rapo_tools.web.browse import BrowseTool

PUBLIC_ADDRESS = "93.184.215.14"  # example.com: global, so the address policy lets it through


class RecordingHandler(http.server.BaseHTTPRequestHandler):
    """Serves one page, one redirect, and remembers the Host header and path of every request."""

    seen: list[tuple[str, str]] = []

    def do_GET(self):  # noqa: N802 - the http.server API
        self.seen.append((self.headers.get("Host", ""), self.path))
        if self.path.startswith("/hop"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/hop?to="))
            self.end_headers()
            return
        body = (b"<html><head><title>Secret</title></head><body><article><h1>Secret</h1><p>The internal "
                b"service answered this page, which the open web must never see.</p></article></body></html>")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_server():
    RecordingHandler.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], RecordingHandler.seen
    server.shutdown()
    server.server_close()


def resolver_for(answers: dict[str, list[list[str]]]):
    """A resolver answering ``answers[host][i]`` to the i-th question about ``host`` (the last answer after)."""
    asked: dict[str, int] = {}

    async def resolve(host: str, port: int) -> list[str]:
        count = asked.get(host, 0)
        asked[host] = count + 1
        replies = answers[host]
        return replies[min(count, len(replies) - 1)]

    resolve.asked = asked
    return resolve


def test_a_rebinding_name_cannot_reach_loopback(loopback_server):
    port, seen = loopback_server
    resolver = resolver_for({"rebind.test": [[PUBLIC_ADDRESS], ["127.0.0.1"]]})
    with BrowseTool({"timeout_s": 2.0}, resolver=resolver) as tool:
        result = tool.call(f"http://rebind.test:{port}/secret")
    assert not result.ok and "internal service" not in result.text
    assert seen == []  # the loopback server was never reached
    assert resolver.asked == {"rebind.test": 1}  # one question, whose checked answer is where it connected


def test_a_name_with_any_internal_address_is_refused(loopback_server):
    port, seen = loopback_server
    resolver = resolver_for({"mixed.test": [[PUBLIC_ADDRESS, "127.0.0.1"]]})
    with BrowseTool(resolver=resolver) as tool:
        result = tool.call(f"http://mixed.test:{port}/secret")
    assert result.error == "blocked_address" and "127.0.0.1" in result.text
    assert seen == []


def test_the_connection_goes_to_the_checked_address_with_the_original_host(loopback_server):
    port, seen = loopback_server
    resolver = resolver_for({"site.test": [["127.0.0.1"]]})
    with BrowseTool({"allowed_origins": (f"http://site.test:{port}",)}, resolver=resolver) as tool:
        result = tool.call(f"http://site.test:{port}/page")
    assert result.ok, result.text
    assert "Title: Secret" in result.text
    assert seen == [(f"site.test:{port}", "/page")]


def test_every_redirect_hop_is_checked_at_connection(loopback_server):
    port, seen = loopback_server
    resolver = resolver_for({"site.test": [["127.0.0.1"]], "rebind.test": [["127.0.0.1"]]})
    with BrowseTool({"allowed_origins": (f"http://site.test:{port}",)}, resolver=resolver) as tool:
        result = tool.call(f"http://site.test:{port}/hop?to=http://rebind.test:{port}/secret")
    assert result.error == "blocked_address" and "rebind.test" in result.text
    assert [path for _, path in seen] == [f"/hop?to=http://rebind.test:{port}/secret"]  # /secret never asked for
