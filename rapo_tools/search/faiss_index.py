"""FAISS indexes for dense search: build (Flat, HNSW, IVF-PQ), save with a JSON sidecar, load memory-mapped.

- ``flat``: exact search; the reference for recall.
- ``hnsw``: the reference pipeline's choice (M=32, efConstruction 200, efSearch 128).
- ``ivfpq``: compressed codes for corpora whose vectors do not fit in memory (wiki-18 at
  384-d float32 is 32 GB; with 48-byte PQ codes it is about 1 GB).

`save_index` writes the index file and ``<path>.json`` next to it, recording the model,
dimension, corpus path, count and the `IndexConfig`, so that a server can check that
its encoder matches the index. `load_index` memory-maps the file where FAISS allows.

Example:
    >>> import numpy as np, tempfile, os
    >>> vectors = np.eye(4, dtype=np.float32)
    >>> index = build_index(vectors, IndexConfig(kind="hnsw", hnsw_m=8))
    >>> path = os.path.join(tempfile.mkdtemp(), "toy.faiss")
    >>> save_index(index, path, {"model": "toy"})
    >>> loaded, sidecar = load_index(path)
    >>> loaded.search(vectors[2:3], 1)[1].tolist(), sidecar["count"], sidecar["config"]["kind"]
    ([[2]], 4, 'hnsw')
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivfpq")
METRICS = ("ip", "l2")
SIDECAR_SUFFIX = ".json"
# FAISS k-means wants about 39 training points per centroid; fewer give poor clusters.
_POINTS_PER_CENTROID = 39


class IndexFileError(RuntimeError):
    """An index file or its sidecar is missing, unreadable or inconsistent."""


@dataclasses.dataclass
class IndexConfig:
    """How to build a FAISS index (stored in the sidecar, so loading restores the search settings)."""

    kind: str = "hnsw"
    """``"flat"`` (exact), ``"hnsw"`` (graph, the reference's choice) or ``"ivfpq"`` (compressed, for huge corpora)."""
    metric: str = "ip"
    """``"ip"`` (inner product: cosine on normalised vectors, the reference's choice) or ``"l2"``."""
    hnsw_m: int = 32
    """HNSW: neighbours per node (the reference uses 32)."""
    ef_construction: int = 200
    """HNSW: candidate list size while building (the reference uses 200)."""
    ef_search: int = 128
    """HNSW: candidate list size while searching (the reference uses 128); higher = better recall, slower."""
    ivf_nlist: int = 4096
    """IVF-PQ: number of coarse clusters (lowered automatically when there are too few training vectors)."""
    ivf_nprobe: int = 32
    """IVF-PQ: clusters visited per query; higher = better recall, slower."""
    pq_m: int = 48
    """IVF-PQ: sub-quantizers per vector (must divide the dimension); bytes per vector at 8 bits."""
    pq_nbits: int = 8
    """IVF-PQ: bits per sub-quantizer code."""
    train_size: int = 200_000
    """IVF-PQ: vectors used to train the quantizers (the first ones added)."""
    use_gpu: bool | None = None
    """Build (and search) on GPU with faiss-gpu: None = when available, False = never, True = required."""

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        if self.metric not in METRICS:
            raise ValueError(f"IndexConfig.metric must be one of {METRICS}, got {self.metric!r}")
        for name in ("hnsw_m", "ef_construction", "ef_search", "ivf_nlist", "ivf_nprobe", "pq_m", "pq_nbits"):
            if getattr(self, name) < 1:
                raise ValueError(f"IndexConfig.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> IndexConfig:
        """Rebuild a config from a sidecar, ignoring keys this version does not know."""
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


def gpu_available() -> bool:
    """True when faiss-gpu is installed and sees at least one GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _wants_gpu(config: IndexConfig) -> bool:
    if config.use_gpu is False:
        return False
    available = gpu_available()
    if config.use_gpu and not available:
        raise RuntimeError("IndexConfig.use_gpu=True but faiss-gpu with a visible GPU is not available")
    # FAISS has no GPU HNSW; the graph is built on CPU.
    return available and config.kind != "hnsw"


def _faiss_metric(metric: str) -> int:
    import faiss

    return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def _empty_index(dimension: int, config: IndexConfig, num_train: int) -> Any:
    import faiss

    metric = _faiss_metric(config.metric)
    if config.kind == "flat":
        return faiss.IndexFlatIP(dimension) if config.metric == "ip" else faiss.IndexFlatL2(dimension)
    if config.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dimension, config.hnsw_m, metric)
        index.hnsw.efConstruction = config.ef_construction
        index.hnsw.efSearch = config.ef_search
        return index
    if dimension % config.pq_m:
        raise ValueError(f"IndexConfig.pq_m={config.pq_m} must divide the vector dimension {dimension}")
    nlist = max(1, min(config.ivf_nlist, num_train // _POINTS_PER_CENTROID))
    if nlist < config.ivf_nlist:
        logger.warning("IVF-PQ: %d training vectors support only %d of %d clusters", num_train, nlist, config.ivf_nlist)
    quantizer = faiss.IndexFlatIP(dimension) if config.metric == "ip" else faiss.IndexFlatL2(dimension)
    index = faiss.IndexIVFPQ(quantizer, dimension, nlist, config.pq_m, config.pq_nbits, metric)
    index.nprobe = config.ivf_nprobe
    return index  # faiss's Python wrapper keeps the quantizer alive with the index


def apply_search_params(index: Any, config: IndexConfig) -> None:
    """Set the search-time knobs (efSearch, nprobe) that FAISS does not always restore from disk."""
    import faiss

    base = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if hasattr(base, "hnsw"):
        base.hnsw.efSearch = config.ef_search
    if hasattr(base, "nprobe"):
        base.nprobe = config.ivf_nprobe


def to_gpu(index: Any) -> Any:
    """Copy a CPU index to GPU 0 when faiss-gpu is available; return it unchanged otherwise (and for HNSW)."""
    import faiss

    if not gpu_available() or hasattr(index, "hnsw"):
        return index
    # faiss's Python wrapper keeps the resources alive with the GPU index.
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


def _to_cpu(index: Any) -> Any:
    import faiss

    return (
        faiss.index_gpu_to_cpu(index) if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(index).__name__ else index
    )


def _as_batches(vectors: np.ndarray | Iterable[np.ndarray], batch_size: int) -> Iterable[np.ndarray]:
    if isinstance(vectors, np.ndarray):
        for start in range(0, len(vectors), batch_size):
            yield vectors[start : start + batch_size]
    else:
        yield from vectors


def _check_batch(batch: np.ndarray, dimension: int | None) -> np.ndarray:
    batch = np.ascontiguousarray(batch, dtype=np.float32)
    if batch.ndim != 2:
        raise ValueError(f"vectors must be a 2-D array (n, dimension), got shape {batch.shape}")
    if dimension is not None and batch.shape[1] != dimension:
        raise ValueError(f"vector dimension changed from {dimension} to {batch.shape[1]} between batches")
    return batch


def build_index(
    vectors: np.ndarray | Iterable[np.ndarray],
    config: IndexConfig | None = None,
    total: int | None = None,
    batch_size: int = 65_536,
    show_progress: bool = True,
) -> Any:
    """Build a FAISS index from an array or from a stream of float32 batches.

    A stream lets a huge corpus be encoded and added chunk by chunk. For IVF-PQ the
    first ``config.train_size`` vectors are held back to train the quantizers, then added.

    Args:
        vectors: One ``(n, d)`` array, or an iterable of ``(batch, d)`` arrays.
        config: Index kind and parameters; defaults to the reference HNSW.
        total: Number of vectors, for the progress bar when ``vectors`` is a stream.
        batch_size: Rows per ``add`` call when ``vectors`` is one array.
        show_progress: Show a tqdm bar.

    Returns:
        A CPU FAISS index (built on GPU first when faiss-gpu is available and the kind allows it).

    Raises:
        ValueError: no vectors, or inconsistent shapes.
    """
    config = config or IndexConfig()
    if isinstance(vectors, np.ndarray):
        total = len(vectors)
    batches = iter(_as_batches(vectors, batch_size))
    index = None
    dimension: int | None = None
    pending: list[np.ndarray] = []
    use_gpu = _wants_gpu(config)
    with tqdm(total=total, desc=f"indexing ({config.kind})", unit="vec", disable=not show_progress) as bar:
        if config.kind == "ivfpq":
            held = 0
            for batch in batches:
                batch = _check_batch(batch, dimension)
                dimension = batch.shape[1]
                pending.append(batch)
                held += len(batch)
                if held >= config.train_size:
                    break
            if not pending:
                raise ValueError("build_index() got no vectors")
            train = np.concatenate(pending)[: config.train_size]
            index = _empty_index(dimension, config, len(train))
            index = to_gpu(index) if use_gpu else index
            index.train(train)
        for batch in [*pending, *batches]:
            batch = _check_batch(batch, dimension)
            if index is None:
                dimension = batch.shape[1]
                index = _empty_index(dimension, config, len(batch))
                index = to_gpu(index) if use_gpu else index
            index.add(batch)
            bar.update(len(batch))
    if index is None:
        raise ValueError("build_index() got no vectors")
    return _to_cpu(index)


def sidecar_path(index_path: str | os.PathLike) -> Path:
    """Where the JSON sidecar of ``index_path`` lives."""
    return Path(f"{index_path}{SIDECAR_SUFFIX}")


def save_index(index: Any, path: str | os.PathLike, sidecar: dict[str, Any], config: IndexConfig | None = None) -> None:
    """Write ``index`` to ``path`` and its metadata to ``<path>.json``.

    ``sidecar`` should hold ``model`` and ``corpus_path``; ``dimension`` and ``count`` are
    filled from the index, and ``config`` from ``config`` (or inferred from the index type).
    Both files are written to temporary names first, so a crash never leaves a torn index.
    """
    import faiss

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = IndexConfig(kind=_infer_kind(index))
    meta = {
        **sidecar,
        "dimension": int(index.d),
        "count": int(index.ntotal),
        "config": dataclasses.asdict(config),
        "faiss_version": faiss.__version__,
    }
    tmp_index, tmp_meta = path.with_name(path.name + ".tmp"), sidecar_path(path).with_name(path.name + ".json.tmp")
    faiss.write_index(_to_cpu(index), str(tmp_index))
    meta["file_bytes"] = tmp_index.stat().st_size  # so that a copy cut short is named as one (`load_index`)
    tmp_meta.write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    os.replace(tmp_index, path)
    os.replace(tmp_meta, sidecar_path(path))


def _infer_kind(index: Any) -> str:
    name = type(index).__name__
    if "HNSW" in name:
        return "hnsw"
    if "IVF" in name:
        return "ivfpq"
    return "flat"


def load_sidecar(path: str | os.PathLike) -> dict[str, Any]:
    """Read the sidecar of the index at ``path``; raises `IndexFileError` when absent or corrupt."""
    meta_path = sidecar_path(path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise IndexFileError(f"the index sidecar {meta_path} is missing; rebuild the index") from error
    except (OSError, ValueError) as error:
        raise IndexFileError(f"the index sidecar {meta_path} is unreadable: {error}") from error
    if not isinstance(meta, dict):
        raise IndexFileError(f"the index sidecar {meta_path} is not a JSON object")
    return meta


def load_index(path: str | os.PathLike, mmap: bool = True) -> tuple[Any, dict[str, Any]]:
    """Load an index saved by `save_index`, memory-mapped where FAISS allows, with its sidecar.

    Memory-mapping leaves the vectors on disk and lets the OS page them in, so a server
    starts at once and several processes share one copy.

    Raises:
        IndexFileError: the index or sidecar is missing, unreadable, or they disagree.
    """
    import faiss

    path = Path(path)
    if not path.is_file():
        raise IndexFileError(f"no index file at {path}; build one with `rapo search build-index`")
    meta = load_sidecar(path)
    size = path.stat().st_size
    if meta.get("file_bytes", size) != size:
        raise IndexFileError(f"{path} holds {size} bytes where {meta['file_bytes']} were written: it was cut short "
                             "or changed since; copy it again or rebuild it")
    index = None
    if mmap:
        flags = faiss.IO_FLAG_MMAP | getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | faiss.IO_FLAG_READ_ONLY
        try:
            index = faiss.read_index(str(path), flags)
        except RuntimeError as error:  # some index types cannot be mapped; read them normally
            logger.info("memory-mapping %s failed (%s); reading it into memory", path, error)
    if index is None:
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as error:
            raise IndexFileError(f"cannot read the FAISS index {path}: {error}") from error
    if int(index.ntotal) != int(meta.get("count", index.ntotal)) or int(index.d) != int(meta.get("dimension", index.d)):
        raise IndexFileError(
            f"{path} holds {index.ntotal} vectors of dimension {index.d} but its sidecar says "
            f"{meta.get('count')} of dimension {meta.get('dimension')}; rebuild the index"
        )
    apply_search_params(index, IndexConfig.from_dict(meta.get("config", {})))
    return index, meta
