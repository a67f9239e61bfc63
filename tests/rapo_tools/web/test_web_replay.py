"""The replay provider against the reference's real recorded Bing cache (1,000 queries)."""

from __future__ import annotations

import json

import pytest

from rapo_tools.aio import run_sync
from rapo_tools.web.providers.replay import ReplayProvider, parse_reference_text
from rapo_tools.web.results import render_results
from rapo_tools.web.search_tool import WebSearchTool


@pytest.fixture(scope="module")
def cache_path(shared_data):
    return shared_data / "web" / "arpo_search_cache.json"


@pytest.fixture(scope="module")
def recorded(cache_path):
    return json.loads(cache_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def provider(cache_path):
    return ReplayProvider(cache_path)


def test_every_recorded_query_replays_its_recorded_text(provider, recorded):
    assert len(provider) == len(recorded) == 1000
    for query, text in recorded.items():
        results = provider.lookup(query)
        assert results is not None
        if text.strip() == "No search results found.":
            assert results == []
        else:
            # The reference format round-trips: the rendered results are the recorded text.
            assert render_results(results, style="reference") == text.strip()


def test_lookup_ignores_case_spacing_and_the_query_prefix(provider, recorded):
    prefixed = next(query for query in recorded if query.startswith("search query: "))
    bare = prefixed[len("search query: ") :]
    assert provider.lookup("  " + bare.upper() + "  ") == provider.lookup(prefixed)


def test_a_miss_is_a_miss_not_an_invented_result(cache_path):
    with WebSearchTool({"provider": "replay", "replay_path": str(cache_path)}) as tool:
        result = tool.call("a query nobody ever recorded 31337")
    assert not result.ok and result.error == "replay_miss" and "not in the recorded results" in result.text


def test_search_tool_replays_with_top_k(cache_path, recorded):
    query = "Amy Smart film debut Campfire Tales"
    with WebSearchTool({"provider": "replay", "replay_path": str(cache_path), "top_k": 3}) as tool:
        result = tool.call(query)
    assert result.ok and result.text.startswith("Page 1: The film is made up of three")
    assert "Page 3: " in result.text and "Page 4: " not in result.text


def test_recorded_empty_result_is_reported_as_empty(cache_path):
    with WebSearchTool({"provider": "replay", "replay_path": str(cache_path)}) as tool:
        result = tool.call("molecular formula of ascorbic acid")
    assert result.ok and result.text == "No search results found."


def test_bad_replay_files_fail_at_construction(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ReplayProvider(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        ReplayProvider(listed)
    with pytest.raises(FileNotFoundError):
        ReplayProvider(tmp_path / "absent.json")


def test_replay_reads_list_values_too(tmp_path):
    path = tmp_path / "rich.json"
    path.write_text(json.dumps({"q": [{"title": "T", "url": "https://t.example", "snippet": "S"}]}))
    hit = run_sync(ReplayProvider(path).search("q", 10))[0]
    assert (hit.title, hit.url, hit.snippet) == ("T", "https://t.example", "S")
    assert parse_reference_text("Page 1: one\nmore of one\nPage 2: two")[0].snippet == "one\nmore of one"
