"""FAISS index building, saving with a sidecar, memory-mapped loading, and their error paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rapo_tools.search.faiss_index import (
    IndexConfig,
    IndexFileError,
    build_index,
    load_index,
    save_index,
    sidecar_path,
)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2_000, 32)).astype(np.float32)
    return data / np.linalg.norm(data, axis=1, keepdims=True)


def _self_recall(index, vectors: np.ndarray, n: int = 200) -> float:
    _, rows = index.search(vectors[:n], 1)
    return float(np.mean(rows[:, 0] == np.arange(n)))


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_flat_and_hnsw_find_each_vector_itself(vectors, kind):
    index = build_index(vectors, IndexConfig(kind=kind), show_progress=False)
    assert index.ntotal == len(vectors)
    assert _self_recall(index, vectors) >= (1.0 if kind == "flat" else 0.95)


def test_ivfpq_trains_on_a_stream_and_clamps_its_cluster_count(vectors):
    config = IndexConfig(kind="ivfpq", ivf_nlist=4096, pq_m=8, pq_nbits=6, ivf_nprobe=16, train_size=1_500)
    stream = (vectors[start : start + 300] for start in range(0, len(vectors), 300))
    index = build_index(stream, config, total=len(vectors), show_progress=False)
    assert index.ntotal == len(vectors)
    assert index.nlist == 1_500 // 39  # too few training points for 4096 clusters
    assert _self_recall(index, vectors) > 0.3  # compressed codes: approximate, far above chance (1/2000)


def test_save_and_load_round_trip_with_sidecar(tmp_path, vectors):
    config = IndexConfig(kind="hnsw", hnsw_m=16, ef_search=64)
    index = build_index(vectors, config, show_progress=False)
    path = tmp_path / "sub" / "toy.faiss"
    save_index(index, path, {"model": "toy", "corpus_path": "/x.jsonl"}, config)
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["model"] == "toy" and meta["count"] == 2_000 and meta["dimension"] == 32
    assert meta["config"]["kind"] == "hnsw"
    for mmap in (True, False):
        loaded, sidecar = load_index(path, mmap=mmap)
        assert loaded.hnsw.efSearch == 64 and sidecar["corpus_path"] == "/x.jsonl"
        assert np.array_equal(loaded.search(vectors[:5], 3)[1], index.search(vectors[:5], 3)[1])


def test_broken_files_raise_index_file_errors(tmp_path, vectors):
    with pytest.raises(IndexFileError, match="no index file"):
        load_index(tmp_path / "missing.faiss")
    path = tmp_path / "a.faiss"
    save_index(build_index(vectors[:10], IndexConfig(kind="flat"), show_progress=False), path, {})
    sidecar_path(path).write_text("{ torn")
    with pytest.raises(IndexFileError, match="unreadable"):
        load_index(path)
    sidecar_path(path).write_text(json.dumps({"count": 11, "dimension": 32}))
    with pytest.raises(IndexFileError, match="rebuild"):
        load_index(path)
    path.write_bytes(b"not a faiss index")
    sidecar_path(path).write_text("{}")
    with pytest.raises(IndexFileError, match="cannot read"):
        load_index(path)


def test_an_index_file_cut_short_is_named_as_one(tmp_path, vectors):
    path = tmp_path / "a.faiss"
    save_index(build_index(vectors[:100], IndexConfig(kind="flat"), show_progress=False), path, {})
    path.write_bytes(path.read_bytes()[:1000])  # a copy that stopped
    with pytest.raises(IndexFileError, match="cut short"):
        load_index(path)


def test_a_cached_index_cut_short_is_built_again(tmp_path, embedder):
    from rapo_tools.search.cache import cached_corpus_index

    corpus = tmp_path / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "title": f"T{i}", "text": f"passage {i}"}) + "\n"
                              for i in range(5)))
    path = cached_corpus_index(corpus, embedder, cache_dir=tmp_path, show_progress=False)
    whole = path.read_bytes()
    path.write_bytes(whole[:100])
    assert cached_corpus_index(corpus, embedder, cache_dir=tmp_path, show_progress=False) == path
    assert load_index(path)[0].ntotal == 5 and path.stat().st_size == len(whole)


def test_bad_inputs_and_configs_are_rejected(vectors):
    with pytest.raises(ValueError, match="kind"):
        IndexConfig(kind="annoy")
    with pytest.raises(ValueError, match="hnsw_m"):
        IndexConfig(hnsw_m=0)
    with pytest.raises(ValueError, match="no vectors"):
        build_index(iter([]), show_progress=False)
    with pytest.raises(ValueError, match="2-D"):
        build_index(vectors[0], show_progress=False)
    with pytest.raises(ValueError, match="dimension changed"):
        build_index(iter([vectors[:5], vectors[:5, :16]]), show_progress=False)
    with pytest.raises(ValueError, match="must divide"):
        build_index(vectors, IndexConfig(kind="ivfpq", pq_m=7), show_progress=False)
