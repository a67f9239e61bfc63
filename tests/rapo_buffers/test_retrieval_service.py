"""Index both real buffers, serve them on loopback, query with the reference JSON; client and typed errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rapo_buffers.client import RetrievalClient, parse_retrieve_answer
from rapo_buffers.retriever import InProcessRetriever
from rapo_buffers.service import create_retrieval_app
from rapo_tools.base import BadToolInputError, ServiceUnavailableError
from rapo_tools.search.faiss_index import IndexFileError, load_sidecar
from rapo_tools.serving import serve_in_thread


@pytest.fixture(scope="module", params=["scripted", "gsm8k"])
def served(request):
    buffer = request.getfixturevalue(f"{request.param}_buffer")
    app = create_retrieval_app(buffer.retriever, health_info=lambda: {"steps": len(buffer.traces)})
    with serve_in_thread(app) as url:
        yield buffer, url


def test_sidecar_records_model_count_and_normalisation(scripted_buffer, gsm8k_buffer):
    for buffer, kind in ((scripted_buffer, "hnsw"), (gsm8k_buffer, "flat")):
        sidecar = load_sidecar(buffer.index_path)
        assert sidecar["count"] == len(buffer.traces) and sidecar["model"] == "all-MiniLM-L6-v2"
        assert sidecar["config"]["kind"] == kind and sidecar["normalization"]["max_chars"] == 1300
        assert sidecar["encoder"] == {"pooling": "model", "max_length": None, "truncation_side": "left",
                                      "position_ids": "own"}
    assert load_sidecar(scripted_buffer.index_path)["config"]["ef_search"] == 128


def test_reference_json_over_http(served):
    buffer, url = served
    trace = buffer.traces[1]
    answer = httpx.post(
        f"{url}/retrieve", json={"queries": [trace.key, buffer.traces[0].key], "topk": 3, "return_scores": True}
    ).json()
    assert len(answer["result"]) == 2
    hits = answer["result"][0]
    assert len(hits) == 3 and set(hits[0]) >= {"document", "reward", "score"}
    assert hits[0]["document"] == trace.value and hits[0]["reward"] == trace.reward
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    no_scores = httpx.post(f"{url}/retrieve", json={"queries": [trace.key], "topk": 1, "return_scores": False}).json()
    assert "score" not in no_scores["result"][0][0] and "reward" in no_scores["result"][0][0]
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["steps"] == len(buffer.traces)


def test_client_matches_the_in_process_retriever(served):
    buffer, url = served
    queries = [buffer.traces[2].key, buffer.traces[-1].key + " and then?"]
    client = RetrievalClient(url)
    try:
        remote = client.retrieve(queries, topk=4)
        local = buffer.retriever.retrieve(queries, topk=4)
        assert [[c.value for c in hits] for hits in remote] == [[c.value for c in hits] for hits in local]
        assert [[c.is_final for c in hits] for hits in remote] == [[c.is_final for c in hits] for hits in local]
        assert remote[0][0].score == pytest.approx(local[0][0].score, abs=1e-5)
    finally:
        client.close()


def test_bad_requests_get_4xx_and_the_client_a_typed_error(served):
    _, url = served
    assert httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": -1}).status_code == 422
    assert httpx.post(f"{url}/retrieve", json={"queries": ["q"], "document_format": "object"}).status_code == 422
    assert (
        httpx.post(f"{url}/retrieve", content=b"{not json", headers={"content-type": "application/json"}).status_code
        == 422
    )
    client = RetrievalClient(url, retries=0)
    try:
        with pytest.raises(BadToolInputError):
            client.retrieve(["q"], topk=10_000)
    finally:
        client.close()
    assert httpx.post(f"{url}/retrieve", json={"queries": ["still serving"], "topk": 1}).status_code == 200


BAD_BODIES = [
    (b'{"queries": ["\\ud800 context"], "topk": 3}', "surrogate"),
    (b'{"queries": ["q"], "topk": 1e400}', "infinity"),
    (b'{"queries": ["q"], "topk": NaN}', "not valid JSON"),
    (b'{"queries": [7]}', "string"),
    (b'{"queries": ["\xff"]}', "UTF-8"),
]


def test_bad_requests_fail_alone_among_concurrent_valid_ones(served):
    buffer, url = served
    keys = [trace.key for trace in buffer.traces[:24]]
    bad = BAD_BODIES * 2

    async def main():
        json_type = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            requests = []  # valid and bad interleaved, all in flight at once
            for position, key in enumerate(keys):
                requests.append(client.post("/retrieve", json={"queries": [key], "topk": 3}))
                if position < len(bad):
                    requests.append(client.post("/retrieve", content=bad[position][0], headers=json_type))
            return await asyncio.gather(*requests)

    answers = asyncio.run(main())
    bad_positions = {2 * position + 1 for position in range(len(bad))}
    valid_answers = [answer for i, answer in enumerate(answers) if i not in bad_positions]
    bad_answers = [answers[i] for i in sorted(bad_positions)]
    for answer, (_, reason) in zip(bad_answers, bad, strict=True):
        assert answer.status_code == 422 and reason in answer.json()["detail"]
    expected = [hits[0].value for hits in buffer.retriever.retrieve(keys, topk=1)]
    assert all(answer.status_code == 200 and len(answer.json()["result"][0]) == 3 for answer in valid_answers)
    assert [answer.json()["result"][0][0]["document"] for answer in valid_answers] == expected


def test_dead_service_and_malformed_answers_raise_service_unavailable():
    client = RetrievalClient("http://127.0.0.1:9", timeout_s=0.5, retries=1, backoff_s=0.01)
    with pytest.raises(ServiceUnavailableError):
        client.retrieve(["q"], topk=1)
    for answer in (
        {"result": [[{"document": 3}]]},
        {"result": []},
        [1, 2],
        {"result": [[{"document": "d", "reward": "x"}]]},
    ):
        with pytest.raises(ServiceUnavailableError):
            parse_retrieve_answer(answer, expected_queries=1)


def test_mismatched_index_is_refused(scripted_buffer, gsm8k_buffer, embedder):
    with pytest.raises(IndexFileError):
        InProcessRetriever.from_files(gsm8k_buffer.corpus_path, scripted_buffer.index_path, embedder)


def test_default_topk_of_the_server_and_the_reference_edge_cases(scripted_buffer):
    app = create_retrieval_app(scripted_buffer.retriever, default_topk=5)
    with serve_in_thread(app) as url:
        for body in ({"queries": ["bolts"]}, {"queries": ["bolts"], "topk": 0}, {"queries": ["bolts"], "topk": None}):
            assert len(httpx.post(f"{url}/retrieve", json=body).json()["result"][0]) == 5  # reference: topk or default
        empty = httpx.post(f"{url}/retrieve", json={"queries": [], "topk": 3})
        assert empty.status_code == 200 and empty.json() == {"result": []}  # as the reference answers
