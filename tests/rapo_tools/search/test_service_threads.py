"""The search service pins torch's intra-op threads of the thread that runs the search function."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

from rapo_tools.search.service import BatchingConfig, create_search_app, IntraOpThreadLimit
from rapo_tools.serving import serve_in_thread


def _threads_seen_by_search(batching: BatchingConfig) -> list[int]:
    seen: list[int] = []

    def search_batch(queries: list[str], topk: int) -> list[list[dict]]:
        seen.append(torch.get_num_threads())
        return [[{"document": {"contents": query}, "score": 1.0}] for query in queries]

    with serve_in_thread(create_search_app(search_batch, batching=batching)) as url:
        for _ in range(3):
            response = httpx.post(f"{url}/wikiSearch", json={"queries": ["a", "b"], "topk": 1})
            assert response.status_code == 200
    return seen


@pytest.mark.parametrize("micro_batching", [True, False])
def test_search_function_runs_single_threaded_by_default(micro_batching):
    seen = _threads_seen_by_search(BatchingConfig(enabled=micro_batching))
    assert seen and set(seen) == {1}


def test_limit_applies_to_the_calling_thread_only_once_set():
    limit = IntraOpThreadLimit(1)
    seen: list[int] = []

    def worker() -> None:
        limit()
        limit()  # a second call in the same thread is a no-op
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [1]


def test_bad_thread_count_is_rejected():
    with pytest.raises(ValueError, match="intra_op_threads"):
        IntraOpThreadLimit(0)
