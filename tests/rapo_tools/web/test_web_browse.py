"""The ``<browse>`` tool against real pages on loopback, including hostile ones."""

from __future__ import annotations

import time

import pytest

from rapo_tools.aio import run_sync
from rapo_tools.web.browse import BrowseTool


@pytest.fixture(scope="module")
def browser():
    with BrowseTool({"allow_private": True, "timeout_s": 3.0, "max_bytes": 1_000_000}) as tool:
        yield tool


def test_html_page_gives_main_text_without_boilerplate(browser, web_url):
    result = browser.call(f"{web_url}/pages/ada")
    assert result.ok, result.text
    assert result.text.startswith(f"URL: {web_url}/pages/ada\nTitle: Ada Lovelace")
    assert "Analytical Engine" in result.text and "born in London in 1815" in result.text
    assert "Cookie settings" not in result.text  # the footer is not main text
    assert f"Charles Babbage -> {web_url}/pages/babbage" in result.text  # links to browse on


def test_redirect_is_followed_to_the_final_url(browser, web_url):
    result = browser.call(f"  {web_url}/redirect \n")
    assert result.ok and result.text.startswith(f"URL: {web_url}/pages/ada")


def test_plain_text_is_shown_as_is(browser, web_url):
    result = browser.call(f"{web_url}/plain")
    assert result.ok and "Plain facts: the Nile is about 6,650 km long." in result.text


def test_50_mb_page_is_cut_at_the_size_cap(browser, web_url):
    start = time.monotonic()
    page = run_sync(browser.read(f"{web_url}/big"))
    result = browser.call(f"{web_url}/big")
    assert page.truncated and "4242" in page.text
    assert result.ok and result.truncated and "only its beginning was read" in result.text
    assert len(result.text) <= browser.max_result_chars
    assert time.monotonic() - start < 60  # bounded: the 50 MB were never downloaded in full


def test_slow_page_times_out(web_url):
    with BrowseTool({"allow_private": True, "timeout_s": 1.0}) as tool:
        result = tool.call(f"{web_url}/slow")
    assert not result.ok and result.timed_out and result.error == "timeout"


@pytest.mark.parametrize("path", ["/binary", "/octets"])
def test_binary_content_is_refused(browser, web_url, path):
    result = browser.call(f"{web_url}{path}")
    assert not result.ok and result.error == "fetch_failed"
    assert "image/png" in result.text if path == "/binary" else "binary data" in result.text


def test_redirect_loop_is_caught(browser, web_url):
    result = browser.call(f"{web_url}/loop/a")
    assert not result.ok and result.error == "fetch_failed" and "redirect loop" in result.text


def test_missing_page_reports_the_status(browser, web_url):
    result = browser.call(f"{web_url}/pages/absent")
    assert not result.ok and "HTTP 404" in result.text


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "javascript:alert(1)", "example.com", ""])
def test_non_http_urls_are_refused(browser, url):
    result = browser.call(url)
    assert not result.ok and result.error == "bad_input"


def test_loopback_is_refused_unless_allowed(web_url):
    with BrowseTool() as strict:
        refused = strict.call(f"{web_url}/pages/ada")
        private = strict.call("http://10.0.0.1/")
        mapped = strict.call("http://[::ffff:127.0.0.1]:9/")
    assert not refused.ok and refused.error == "blocked_address" and "127.0.0.1" in refused.text
    assert private.error == "blocked_address" and mapped.error == "blocked_address"
    with BrowseTool({"allowed_origins": (web_url,)}) as allow_listed:
        assert allow_listed.call(f"{web_url}/pages/ada").ok
        # The allow-list opens one origin, not the whole machine.
        assert allow_listed.call("http://127.0.0.1:9/").error == "blocked_address"


def test_unreachable_host_fails_cleanly():
    with BrowseTool({"allow_private": True, "timeout_s": 2.0}) as tool:
        result = tool.call("http://127.0.0.1:9/nothing-listens-here")
    assert not result.ok and result.error == "service_unavailable"


def test_summary_through_an_openai_compatible_endpoint(web_url, test_web):
    summarizer = {"base_url": f"{web_url}/v1", "model": "summariser", "api_key_env": None}
    with BrowseTool({"allow_private": True, "summarizer": summarizer}) as tool:
        tool.question = "In which city was Ada Lovelace born?"
        result = tool.call(f"{web_url}/pages/ada")
    assert result.ok and "Summary:" in result.text and "born in London in 1815" in result.text
    assert "Related" not in result.text  # the summary replaced the page text
    request = test_web[1].state.chat_requests[-1]
    assert (
        request["model"] == "summariser"
        and "In which city was Ada Lovelace born?" in request["messages"][-1]["content"]
    )


def test_dead_summariser_fails_the_call_cleanly(web_url):
    summarizer = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 0, "timeout_s": 1.0}
    with BrowseTool({"allow_private": True, "summarizer": summarizer}) as tool:
        result = tool.call(f"{web_url}/pages/ada")
    assert not result.ok and result.error == "service_unavailable"
