"""The embedded default buffer: built on first use into RAPO_CACHE_DIR, then loaded from the cache."""

from __future__ import annotations

import pytest

from rapo_buffers.client import RetrievalClient
from rapo_agents.buffer_build.defaults import (
    DefaultBufferConfig,
    default_buffer_dir,
    default_retriever,
    ensure_default_buffer,
    resolve_retriever,
)
from rapo_buffers.schema import read_buffer


def test_built_once_then_cached(tmp_path, monkeypatch, embedder):
    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path))
    config = DefaultBufferConfig(num_tasks=4, index_kind="flat")
    corpus_path, index_path = ensure_default_buffer(config, show_progress=False, embedder=embedder)
    assert corpus_path.parent == default_buffer_dir(config) and str(corpus_path).startswith(str(tmp_path))
    traces, _ = read_buffer(corpus_path)
    assert len({trace.question_id for trace in traces}) == 4 and all(trace.source == "expert" for trace in traces)
    stamp = (corpus_path.stat().st_mtime_ns, index_path.stat().st_mtime_ns)
    assert ensure_default_buffer(config, show_progress=False, embedder=embedder) == (corpus_path, index_path)
    assert (corpus_path.stat().st_mtime_ns, index_path.stat().st_mtime_ns) == stamp  # not rebuilt
    retriever = default_retriever(config, show_progress=False, embedder=embedder)
    assert retriever is default_retriever(config, show_progress=False, embedder=embedder)
    best = retriever.retrieve([traces[1].key], topk=1)[0][0]
    assert best.value == traces[1].value
    assert default_buffer_dir(DefaultBufferConfig(num_tasks=5)) != default_buffer_dir(config)


def test_a_cached_buffer_damaged_since_is_built_again(tmp_path, monkeypatch, embedder):
    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path))
    config = DefaultBufferConfig(num_tasks=3, index_kind="flat")
    corpus_path, index_path = ensure_default_buffer(config, show_progress=False, embedder=embedder)
    traces, _ = read_buffer(corpus_path)
    sidecar = index_path.with_name(index_path.name + ".json")
    sidecar.write_text(sidecar.read_text(encoding="utf-8")[:50], encoding="utf-8")  # cut short
    retriever = default_retriever(config, show_progress=False, embedder=embedder)
    assert retriever.retrieve([traces[0].key], topk=1)[0][0].value == traces[0].value
    assert sidecar.read_text(encoding="utf-8").rstrip().endswith("}")  # written whole again


def test_resolve_retriever_strings():
    assert isinstance(resolve_retriever("http://127.0.0.1:8001"), RetrievalClient)
    with pytest.raises(ValueError):
        resolve_retriever("ftp://nowhere")
    with pytest.raises(ValueError):
        DefaultBufferConfig(split="nonsense").digest()


SMALL_KB = (("num_countries", 3), ("num_organizations", 6), ("num_people", 16), ("num_towns", 8), ("num_works", 10))


def test_the_qa_buffer_builds_offline_from_the_search_experts_episodes(tmp_path, monkeypatch, embedder):
    from rapo_env.tasks.knowledge_base import KnowledgeBase

    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path))  # a fresh machine: nothing cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = DefaultBufferConfig(task="qa", num_tasks=9, knowledge_base=SMALL_KB, index_kind="flat")
    corpus_path, _ = ensure_default_buffer(config, show_progress=False, embedder=embedder)
    assert default_buffer_dir(config).name.startswith("scripted-qa-train-9-")
    traces, _ = read_buffer(corpus_path)
    training = KnowledgeBase.generate(0, **dict(SMALL_KB)).split("train")[:9]
    assert {trace.question_id for trace in traces} == {task.id for task in training}
    searches = [trace for trace in traces if "<search>" in trace.value]
    assert searches and all(" <result>\nDoc 1 (Title: " in trace.value for trace in searches)
    retriever = default_retriever(config, show_progress=False, embedder=embedder)
    second_hop = next(trace for trace in searches if "Next I look up" in trace.value)
    assert retriever.retrieve([second_hop.key], topk=1)[0][0].value == second_hop.value
    assert default_buffer_dir(config) != default_buffer_dir(DefaultBufferConfig(num_tasks=9))
