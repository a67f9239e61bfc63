"""The real /wikiSearch server over a MiniLM index of the HotpotQA corpus, queried over loopback HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rapo_env.tasks.hotpotqa import load_hotpotqa

from .conftest import HOTPOTQA_QUESTIONS


def test_index_sidecar_describes_the_build(hotpotqa_index, hotpotqa_corpus):
    meta = json.loads(hotpotqa_index.with_name(hotpotqa_index.name + ".json").read_text())
    assert meta["count"] == 994 and meta["dimension"] == 384
    assert meta["model"] == "all-MiniLM-L6-v2" and meta["corpus_path"] == str(hotpotqa_corpus.resolve())


def test_in_process_search_finds_gold_paragraphs(hotpotqa_wiki, shared_data):
    tasks = load_hotpotqa(shared_data / HOTPOTQA_QUESTIONS, limit=20)
    ranked = hotpotqa_wiki.search([task.question for task in tasks], topk=10)
    found = [
        any(hit.passage.title in task.metadata["supporting_titles"] for hit in hits)
        for task, hits in zip(tasks, ranked, strict=True)
    ]
    assert sum(found) >= 15  # dense retrieval finds a gold paragraph in the top 10 for most questions
    scores = [hit.score for hit in ranked[0]]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1.0001


def test_reference_request_and_response_json(wiki_server):
    request = {"queries": ["Lilu mythology demon", "Demon Dice game"], "topk": 3, "return_scores": True}
    answer = httpx.post(f"{wiki_server}/wikiSearch", json=request, timeout=30).json()
    assert list(answer) == ["result"] and len(answer["result"]) == 2
    first = answer["result"][1][0]
    assert set(first) == {"document", "score"} and isinstance(first["score"], float)
    assert first["document"].startswith('"Demon Dice"\n')  # the reference's reply: the `contents` string
    assert all(len(hits) == 3 for hits in answer["result"])
    rich = httpx.post(f"{wiki_server}/wikiSearch", json={**request, "document_format": "object"}, timeout=30).json()[
        "result"
    ][1][0]["document"]
    assert rich["title"] == "Demon Dice" and rich["contents"] == first["document"] and set(rich) >= {"id", "text"}
    plain = httpx.post(
        f"{wiki_server}/wikiSearch", json={"queries": ["Demon Dice"], "topk": 1, "return_scores": False}, timeout=30
    ).json()
    assert set(plain["result"][0][0]) == {"document"}
    for default_topk in ({}, {"topk": 0}, {"topk": None}):  # the reference: `request.topk or default`
        default = httpx.post(f"{wiki_server}/wikiSearch", json={"queries": ["Demon Dice"], **default_topk}, timeout=30)
        assert len(default.json()["result"][0]) == 3
    empty = httpx.post(f"{wiki_server}/wikiSearch", json={"queries": []}, timeout=30)
    assert empty.status_code == 200 and empty.json() == {"result": []}  # as the reference answers


def test_health(wiki_server):
    health = httpx.get(f"{wiki_server}/health", timeout=10).json()
    assert health["status"] == "ok" and health["passages"] == 994 and health["micro_batching"] is True


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"queries": [""]}, 422, "query 0 is empty"),
        ({"queries": ["ok", "   "]}, 422, "query 1 is empty"),
        ({"queries": ["x" * 100_000]}, 413, "100000 characters"),
        ({"queries": ["q"] * 10_000}, 413, "10000 queries"),
        ({"queries": "not a list"}, 422, "list"),
        ({"queries": [1, 2]}, 422, "string"),
        ({"queries": ["ok"], "topk": "3"}, 422, "integer"),
        ({"queries": ["ok"], "topk": -1}, 422, "topk"),
        ({"queries": ["ok"], "topk": True}, 422, "integer"),
        ({"queries": ["ok"], "topk": 2.5}, 422, "integer"),
        ({"queries": ["ok"], "document_format": "xml"}, 422, "contents, object"),
        ({"queries": ["ok"], "topk": 10_000}, 422, "topk"),
        ({"query": "wrong field"}, 422, "queries"),
    ],
)
def test_bad_requests_get_clear_4xx(wiki_server, payload, status, message):
    response = httpx.post(f"{wiki_server}/wikiSearch", json=payload, timeout=30)
    assert response.status_code == status
    assert message in json.dumps(response.json()["detail"])


def test_malformed_json_and_oversized_bodies(wiki_server):
    response = httpx.post(
        f"{wiki_server}/wikiSearch", content=b"{not json", timeout=10, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    huge = json.dumps({"queries": ["y" * 1_000_000] * 5}).encode()
    response = httpx.post(
        f"{wiki_server}/wikiSearch", content=huge, timeout=30, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "bytes" in response.json()["detail"]
    assert httpx.get(f"{wiki_server}/health", timeout=10).json()["status"] == "ok"  # still serving


def test_concurrent_clients_each_get_their_own_ranking(wiki_server):
    titles = ["Demon Dice", "Lilu (mythology)", "Alû", "Demon algorithm"] * 4

    async def main():
        async with httpx.AsyncClient(base_url=wiki_server, timeout=60) as client:
            answers = await asyncio.gather(
                *(client.post("/wikiSearch", json={"queries": [title], "topk": 1}) for title in titles)
            )
        return [answer.json()["result"][0][0]["document"].split("\n")[0].strip('"') for answer in answers]

    assert asyncio.run(main()) == titles
