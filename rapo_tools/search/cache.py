"""Cached dense indexes of corpus files, built on first use under rapo's cache directory.

The cache directory is `rapo_tools.cache.rapo_cache_dir` (``$RAPO_CACHE_DIR``, else ``~/.cache/rapo``). An index is
keyed by the corpus file's size, modification time and path, the encoder (model and `EncoderSpec`)
and the index kind, so editing the corpus or switching models builds a fresh one.

Example:
    >>> import json, tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> corpus = os.path.join(folder, "c.jsonl")
    >>> with open(corpus, "w") as f:
    ...     _ = f.write(json.dumps({"title": "Oslo", "text": "Oslo is in Norway."}) + "\\n")
    >>> path = cached_corpus_index(corpus, cache_dir=folder, show_progress=False)
    >>> path == cached_corpus_index(corpus, cache_dir=folder, show_progress=False)  # built once
    True
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from pathlib import Path

from rapo_tools.cache import rapo_cache_dir
from rapo_tools.search.embedding import DEFAULT_MODEL_NAME, SEARCH_ENCODER, Embedder
from rapo_tools.search.faiss_index import IndexConfig, IndexFileError, load_sidecar
from rapo_tools.search.wiki_search import build_corpus_index


def cached_corpus_index(
    corpus_path: str | os.PathLike,
    embedder: Embedder | None = None,
    config: IndexConfig | None = None,
    cache_dir: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> Path:
    """The path of a saved index over ``corpus_path``, building it (once, under a file lock) when missing.

    Args:
        corpus_path: Any corpus file `rapo_tools.search.corpus` reads.
        embedder: Encoder (default: the embedded MiniLM, loaded only if a build is needed).
        config: Index settings (default: exact ``flat`` search, right for the small corpora cached here).
        cache_dir: Cache root (default: `rapo_cache_dir`).
        show_progress: Show progress bars while building.
    """
    corpus_path = Path(corpus_path).resolve()
    if not corpus_path.is_file():
        raise IndexFileError(f"no corpus file at {corpus_path}")
    config = config or IndexConfig(kind="flat")
    model_name = embedder.model_name if embedder is not None else DEFAULT_MODEL_NAME
    stat = corpus_path.stat()
    parts = [str(corpus_path), stat.st_size, stat.st_mtime_ns, model_name, dataclasses.asdict(config)]
    if embedder is not None and embedder.encoder != SEARCH_ENCODER:  # the default keeps the keys made before specs
        parts.append(dataclasses.asdict(embedder.encoder))
    fingerprint = json.dumps(parts, sort_keys=True)
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else rapo_cache_dir()
    index_path = root / "indexes" / f"{corpus_path.stem}-{key}.faiss"
    index_path.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (vector envs, test workers) may ask at once: one builds, the others wait.
    with open(f"{index_path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(index_path):
            return index_path
        build_corpus_index(corpus_path, index_path, embedder or Embedder(), config, show_progress=show_progress)
    return index_path


def _is_complete(index_path: Path) -> bool:
    if not index_path.is_file():
        return False
    try:
        sidecar = load_sidecar(index_path)
    except IndexFileError:
        return False
    # A cached index from before sidecars kept the file's size is built again once, as is one cut short since.
    return sidecar.get("file_bytes") == index_path.stat().st_size
