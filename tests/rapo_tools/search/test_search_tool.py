"""The <search> tool: in-process and over HTTP, the reference observation, and failures that never raise."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from fastapi import FastAPI

from rapo_tools.aio import run_sync
from rapo_tools.search.tool import SearchTool, SearchToolConfig, format_hits
from rapo_tools.serving import serve_in_thread


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_in_process_and_service_give_the_same_reference_observation(hotpotqa_wiki, wiki_server):
    with SearchTool(hotpotqa_wiki) as local, SearchTool(wiki_server) as remote:
        here, there = local.call("Demon Dice collectible game"), remote.call("Demon Dice collectible game")
    assert here.ok and there.ok and here.text == there.text
    lines = here.text.splitlines()
    assert lines[0] == "Doc 1 (Title: Demon Dice)"
    assert lines[1].startswith("Demon Dice, originally published as Chaos Progenitus")
    assert sum(line.startswith("Doc ") for line in lines) == 3  # top 3, as the reference


def test_concurrent_calls_are_answered_individually(hotpotqa_wiki):
    titles = ["Demon Dice", "Lilu (mythology)", "Alû", "Demon algorithm"] * 3
    tool = SearchTool(hotpotqa_wiki, SearchToolConfig(topk=1))

    async def main():
        return await asyncio.gather(*(tool.acall(title) for title in titles))

    results = asyncio.run(main())
    tool.close()
    assert [result.text.splitlines()[0] for result in results] == [f"Doc 1 (Title: {t})" for t in titles]


def test_observation_format_is_configurable(hotpotqa_wiki):
    config = SearchToolConfig(
        topk=2, doc_template="[{rank}] {title} ({score:.2f}): {text}", separator="\n---\n", max_doc_chars=40
    )
    with SearchTool(hotpotqa_wiki, config) as tool:
        text = tool.call("Demon Dice").text
    first, second = text.split("\n---\n")
    assert first.startswith("[1] Demon Dice (0.") and first.endswith(" ...")
    assert second.startswith("[2] ")
    assert format_hits([], config) == "No results found."
    search_r1_hit = {"document": {"id": "7", "contents": '"Paris"\nCapital of France.'}, "score": 0.5}
    assert format_hits([search_r1_hit], SearchToolConfig()) == "Doc 1 (Title: Paris)\nCapital of France."


def test_bad_queries_fail_cleanly(hotpotqa_wiki):
    with SearchTool(hotpotqa_wiki, SearchToolConfig(max_query_chars=50)) as tool:
        empty, long = tool.call("  \n "), tool.call("word " * 40)
    assert not empty.ok and empty.error == "bad_input" and "empty" in empty.text
    assert not long.ok and long.error == "bad_input" and "limit is 50" in long.text


def test_dead_service_gives_a_failed_result_not_an_exception():
    url = f"http://127.0.0.1:{_free_port()}"
    with SearchTool(url, SearchToolConfig(timeout_s=1.0, retries=1, backoff_s=0.01)) as tool:
        result = tool.call("anything")
    assert not result.ok and result.error == "service_unavailable"
    assert result.text.startswith("search failed: cannot reach")


def test_slow_service_times_out_and_malformed_answers_are_unavailable():
    app = FastAPI()

    @app.post("/wikiSearch")
    async def slow(payload: dict):
        await asyncio.sleep(3.0)
        return {"result": [[]]}

    @app.post("/broken/wikiSearch")
    async def broken(payload: dict):
        return {"unexpected": True}

    with serve_in_thread(app) as url:
        with SearchTool(url, SearchToolConfig(timeout_s=0.3, retries=0)) as tool:
            slow_result = tool.call("anything")
        with SearchTool(url, SearchToolConfig(route="/broken/wikiSearch")) as tool:
            broken_result = tool.call("anything")
    assert not slow_result.ok and slow_result.timed_out and slow_result.error == "timeout"
    assert not broken_result.ok and broken_result.error == "service_unavailable"
    assert "'result'" in broken_result.text


def test_closed_tool_and_bad_config():
    tool = SearchTool("http://127.0.0.1:1")
    tool.close()
    tool.close()
    result = tool.call("q")
    assert not result.ok and "closed" in result.text
    with pytest.raises(ValueError):
        SearchToolConfig(topk=0)
    assert run_sync(asyncio.sleep(0, result=1)) == 1  # the portal loop is still healthy
