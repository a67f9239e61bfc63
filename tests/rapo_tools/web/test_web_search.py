"""The web ``<search>`` tool against real HTTP search endpoints on loopback (Bing v7 and Brave JSON)."""

from __future__ import annotations

import pytest

from rapo_tools.aio import run_sync
from rapo_tools.web.providers.bing import BingProvider
from rapo_tools.web.search_tool import WebSearchConfig, WebSearchTool

FAST_RETRIES = {"retries": 3, "backoff_s": 0.01, "timeout_s": 5.0}


def bing_tool(web_url: str, key_env: str, path: str = "/v7.0/search", **options) -> WebSearchTool:
    config = {"provider": "bing", "endpoint": f"{web_url}{path}", "api_key_env": key_env, **FAST_RETRIES, **options}
    return WebSearchTool(config)


def test_bing_results_are_normalised_with_urls(web_url, bing_key):
    with bing_tool(web_url, bing_key, top_k=2) as tool:
        results = run_sync(tool.search("Analytical Engine Lovelace Babbage"))
        result = tool.call("Analytical Engine Lovelace Babbage")
    assert [hit.title for hit in results] == ["Ada Lovelace", "Charles Babbage"]
    assert results[0].url == f"{web_url}/pages/ada"
    assert "<b>" not in results[0].snippet and results[0].snippet.startswith("Ada Lovelace:")
    assert result.ok and result.text.startswith("Page 1: Ada Lovelace\nURL: ")
    assert "Page 3" not in result.text  # top_k=2


def test_reference_style_and_default_top_k(web_url, bing_key):
    with bing_tool(web_url, bing_key, result_style="reference") as tool:
        assert tool.config.top_k == 10
        text = tool.call("river Africa Nile").text
    assert text.startswith("Page 1: Nile: The Nile is") and "URL:" not in text


def test_no_results_is_said_plainly(web_url, bing_key):
    with bing_tool(web_url, bing_key) as tool:
        result = tool.call("zzzqqq xxyyzz")
    assert result.ok and result.text == "No search results found."


def test_missing_key_is_a_clear_failed_observation(web_url, monkeypatch):
    monkeypatch.delenv("RAPO_TEST_MISSING_KEY", raising=False)
    with bing_tool(web_url, "RAPO_TEST_MISSING_KEY") as tool:
        result = tool.call("Ada Lovelace")
    assert not result.ok and result.error == "missing_api_key"
    assert "RAPO_TEST_MISSING_KEY" in result.text


def test_wrong_key_is_reported_not_retried(web_url, monkeypatch, test_web):
    monkeypatch.setenv("RAPO_TEST_WRONG_KEY", "not-the-key")
    with bing_tool(web_url, "RAPO_TEST_WRONG_KEY") as tool:
        result = tool.call("wrong key query")
    assert not result.ok and result.error == "bad_input" and "401" in result.text
    assert test_web[1].state.search_requests["wrong key query"] == 0  # rejected before counting


def test_provider_500_then_200_is_retried(web_url, bing_key, test_web):
    with bing_tool(web_url, bing_key, path="/flaky/v7.0/search") as tool:
        result = tool.call("Charles Babbage polymath")
    assert result.ok and "Charles Babbage" in result.text
    assert test_web[1].state.search_requests["Charles Babbage polymath"] == 3  # two 500s, then the 200


def test_provider_that_stays_down_fails_cleanly(web_url, bing_key):
    with bing_tool(web_url, bing_key, path="/down/v7.0/search", retries=1) as tool:
        result = tool.call("anything")
    assert not result.ok and result.error == "service_unavailable" and "503" in result.text


def test_unreachable_provider_fails_cleanly(bing_key):
    with WebSearchTool(
        {
            "provider": "bing",
            "endpoint": "http://127.0.0.1:9/v7.0/search",
            "api_key_env": bing_key,
            "retries": 1,
            "backoff_s": 0.01,
            "timeout_s": 1.0,
        }
    ) as tool:
        result = tool.call("anything")
    assert not result.ok and result.error == "service_unavailable"


def test_brave_provider(web_url, brave_key):
    config = {"provider": "brave", "endpoint": f"{web_url}/res/v1/web/search", "api_key_env": brave_key, **FAST_RETRIES}
    with WebSearchTool(config) as tool:
        results = run_sync(tool.search("Nile river"))
    assert results[0].title == "Nile" and results[0].snippet == "About Nile" and results[0].url.endswith("/pages/nile")


def test_disk_cache_answers_repeated_queries(web_url, bing_key, test_web, tmp_path):
    cache = str(tmp_path / "search.sqlite")
    query = "cached query about Ada Lovelace"
    with bing_tool(web_url, bing_key, cache_path=cache) as tool:
        first = tool.call(query).text
    with bing_tool(web_url, bing_key, cache_path=cache) as tool:  # a later run, same cache file
        second = tool.call(query).text
    assert first == second and "Ada Lovelace" in first
    assert test_web[1].state.search_requests[query] == 1


def test_corrupt_cache_file_costs_only_the_cache(web_url, bing_key, tmp_path):
    cache = tmp_path / "broken.sqlite"
    cache.write_bytes(b"this is not a sqlite database" * 100)
    with bing_tool(web_url, bing_key, cache_path=str(cache)) as tool:
        result = tool.call("Ada Lovelace")
    assert result.ok and "Ada Lovelace" in result.text


def test_bad_queries_are_refused_with_a_reason(web_url, bing_key):
    with bing_tool(web_url, bing_key) as tool:
        empty, long = tool.call("   \n"), tool.call("word " * 300)
    assert not empty.ok and empty.error == "bad_input" and "empty" in empty.text
    assert not long.ok and long.error == "bad_input" and "limit" in long.text


def test_bing_parser_tolerates_odd_answers():
    assert BingProvider.parse({"_type": "SearchResponse"}, 10) == []
    [hit] = BingProvider.parse({"webPages": {"value": [None, {"name": "T", "url": "u", "snippet": "a &amp; b"}]}}, 10)
    assert hit.snippet == "a & b"


def test_config_rejects_unknown_provider():
    with pytest.raises(ValueError, match="unknown search provider"):
        WebSearchConfig(provider="altavista")
    with pytest.raises(ValueError, match="replay_path"):
        WebSearchTool({"provider": "replay"})


def test_rate_limit_is_shared_by_tools_of_one_endpoint(web_url, bing_key):
    with (
        bing_tool(web_url, bing_key, rate_per_s=50.0) as first,
        bing_tool(web_url, bing_key, rate_per_s=50.0) as second,
    ):
        assert first._limiter is second._limiter
        assert first.call("Nile").ok and second.call("Nile").ok
