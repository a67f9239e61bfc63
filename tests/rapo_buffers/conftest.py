"""Small real buffers shared by the buffer tests: the scripted expert's and GSM8K's, embedded and indexed once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rapo_buffers.builder import build_step_traces
from rapo_buffers.index import build_step_index
from rapo_buffers.retriever import InProcessRetriever
from rapo_buffers.schema import StepTrace, write_buffer
from rapo_buffers.sources.gsm8k import gsm8k_trajectories
from rapo_buffers.sources.scripted import ScriptedSourceConfig, scripted_expert_trajectories
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.faiss_index import IndexConfig

SCRIPTED_TASKS = 10
GSM8K_SOLUTIONS = 12


@dataclasses.dataclass
class BuiltBuffer:
    traces: list[StepTrace]
    corpus_path: Path
    index_path: Path
    retriever: InProcessRetriever


@pytest.fixture(scope="session")
def embedder(sentence_encoder) -> Embedder:
    return Embedder(sentence_encoder)


@pytest.fixture(scope="session")
def scripted_trajectories():
    return list(scripted_expert_trajectories(ScriptedSourceConfig(num_tasks=SCRIPTED_TASKS), show_progress=False))


def _build(traces, folder: Path, embedder: Embedder, kind: str) -> BuiltBuffer:
    corpus_path, index_path = folder / "buffer.jsonl", folder / "buffer.index"
    write_buffer(corpus_path, traces)
    build_step_index(traces, index_path, embedder, IndexConfig(kind=kind), corpus_path, show_progress=False)
    return BuiltBuffer(
        traces, corpus_path, index_path, InProcessRetriever.from_files(corpus_path, index_path, embedder)
    )


@pytest.fixture(scope="session")
def scripted_buffer(tmp_path_factory, embedder, scripted_trajectories) -> BuiltBuffer:
    """The scripted expert on 10 procedural training problems, HNSW with the reference parameters."""
    traces, _ = build_step_traces(scripted_trajectories)
    return _build(traces, tmp_path_factory.mktemp("scripted"), embedder, "hnsw")


@pytest.fixture(scope="session")
def gsm8k_buffer(tmp_path_factory, embedder, shared_data) -> BuiltBuffer:
    """The first GSM8K training solutions, converted to python steps, in a Flat index."""
    trajectories = gsm8k_trajectories(shared_data / "math" / "gsm8k_train.jsonl", limit=GSM8K_SOLUTIONS)
    traces, _ = build_step_traces(trajectories)
    return _build(traces, tmp_path_factory.mktemp("gsm8k"), embedder, "flat")
