"""The embedded default Step-Trace Buffers: a scripted expert over its task family, built on first use and cached.

One buffer per family (``DefaultBufferConfig.task``): the python expert over procedural math, or the search
expert over the generated knowledge base. On a fresh machine nothing needs downloading: the first call plays
the expert on the training questions (about 0.1 s per math problem, 0.04 s per QA question), cuts the
trajectories into steps, embeds the keys with the embedded MiniLM and writes buffer + index under
``$RAPO_CACHE_DIR`` (default ``~/.cache/rapo``) in a folder named after the settings and a digest of the problems.
Later calls, from any process, load the cached files. A file lock keeps concurrent first uses from building twice.

`resolve_retriever` turns the strings a config or ``env.spec`` can hold into a retriever:
``"default"`` (this buffer, in-process) or a service URL.

Example:
    >>> import os, tempfile
    >>> os.environ["RAPO_CACHE_DIR"] = tempfile.mkdtemp()
    >>> config = DefaultBufferConfig(num_tasks=4, index_kind="flat")
    >>> retriever = default_retriever(config, show_progress=False)
    >>> candidates = retriever.retrieve(["A warehouse receives 12 crates with 30 bolts in each crate."], topk=2)
    >>> len(candidates[0])
    2
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
from pathlib import Path

from rapo_agents.buffer_build.builder import BuildConfig, build_step_traces
from rapo_buffers.candidates import Retriever
from rapo_buffers.client import retriever_from_url
from rapo_buffers.index import ENCODINGS, build_step_index
from rapo_buffers.retriever import InProcessRetriever
from rapo_buffers.schema import write_buffer
from rapo_agents.buffer_build.sources.scripted import ScriptedSourceConfig, scripted_expert_trajectories
from rapo_env.tasks.knowledge_base import KnowledgeBase
from rapo_env.tasks.procedural_math import SPLIT_SEEDS, ProceduralMath
from rapo_tools.cache import rapo_cache_dir
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.faiss_index import IndexConfig, IndexFileError

FORMAT_VERSION = 2
"""Bumped when the buffer layout or the key normalisation changes, so stale caches are rebuilt."""
CORPUS_FILE, INDEX_FILE, STATS_FILE = "buffer.jsonl", "buffer.index", "build.json"


@dataclasses.dataclass(frozen=True)
class DefaultBufferConfig(ScriptedSourceConfig):
    """Settings of the embedded default buffer: which problems the expert solves (the fields of
    `ScriptedSourceConfig`) and how its keys are indexed. Each distinct setting gets its own cache folder.

    Example:
        >>> DefaultBufferConfig(num_tasks=8, index_kind="flat").max_tool_calls
        3
    """

    index_kind: str = "hnsw"
    """FAISS index: ``hnsw`` (reference parameters) or ``flat`` (exact)."""
    encoder: str = "paper"
    """How keys (and so queries) are embedded: ``paper`` or ``reference`` (`rapo_buffers.index.ENCODINGS`)."""

    def digest(self) -> str:
        """A short hash of the settings and of the questions themselves (a changed generator changes it)."""
        if self.split not in SPLIT_SEEDS:
            raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {self.split!r}")
        if self.task == "qa":
            questions = KnowledgeBase.generate(0, **dict(self.knowledge_base)).split(self.split, self.hops)
            tasks = questions[: self.num_tasks]
        else:
            tasks = ProceduralMath(seed=SPLIT_SEEDS[self.split], num_tasks=self.num_tasks, difficulty=self.difficulty)
        settings = dataclasses.asdict(self)
        del settings["sandbox"]  # the backend that runs the expert's code does not change the traces
        content = hashlib.sha256(json.dumps([FORMAT_VERSION, settings]).encode())
        for task in tasks:
            content.update(task.question.encode())
        return content.hexdigest()[:12]


def default_buffer_dir(config: DefaultBufferConfig | None = None) -> Path:
    """The cache folder of the buffer with these settings."""
    config = config or DefaultBufferConfig()
    name = f"scripted-{config.task}-{config.split}-{config.num_tasks}-{config.digest()}"
    return rapo_cache_dir("step_traces") / name


def ensure_default_buffer(
    config: DefaultBufferConfig | None = None, show_progress: bool = True, embedder: Embedder | None = None
) -> tuple[Path, Path]:
    """Build the default buffer and its index unless cached; return (buffer JSONL path, index path).

    ``embedder`` (default: the embedded MiniLM, loaded when needed) encodes the keys.
    """
    config = config or DefaultBufferConfig()
    folder = default_buffer_dir(config)
    corpus_path, index_path, stats_path = folder / CORPUS_FILE, folder / INDEX_FILE, folder / STATS_FILE
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the files built
        if not stats_path.is_file():  # written last: its presence means a complete build
            trajectories = scripted_expert_trajectories(config, show_progress=show_progress)
            traces, stats = build_step_traces(trajectories, BuildConfig())
            write_buffer(corpus_path, traces)
            build_step_index(
                traces,
                index_path,
                embedder,
                config=IndexConfig(kind=config.index_kind),
                corpus_path=corpus_path,
                show_progress=show_progress,
                encoder=ENCODINGS[config.encoder],
            )
            stats_path.write_text(json.dumps({"config": dataclasses.asdict(config), **stats.as_dict()}, indent=2))
    return corpus_path, index_path


@functools.lru_cache(maxsize=4)
def _cached_retriever(
    config: DefaultBufferConfig, root: str, show_progress: bool, embedder: Embedder | None
) -> InProcessRetriever:
    # ``root`` is part of the cache key: a changed RAPO_CACHE_DIR means another buffer.
    corpus_path, index_path = ensure_default_buffer(config, show_progress=show_progress, embedder=embedder)
    try:
        return InProcessRetriever.from_files(corpus_path, index_path, embedder)
    except (IndexFileError, FileNotFoundError):  # rapo's own cache, cut short or damaged since: built again
        (corpus_path.parent / STATS_FILE).unlink(missing_ok=True)
        corpus_path, index_path = ensure_default_buffer(config, show_progress=show_progress, embedder=embedder)
        return InProcessRetriever.from_files(corpus_path, index_path, embedder)


def default_retriever(
    config: DefaultBufferConfig | None = None, show_progress: bool = True, embedder: Embedder | None = None
) -> InProcessRetriever:
    """The in-process retriever over the default buffer (one per process, setting and embedder)."""
    return _cached_retriever(config or DefaultBufferConfig(), str(rapo_cache_dir()), show_progress, embedder)


def resolve_retriever(spec: str) -> Retriever:
    """``"default"`` -> the default buffer in-process; ``"http://..."``/``"https://..."`` -> a `RetrievalClient`.

    Raises:
        ValueError: for any other string.
    """
    if spec == "default":
        return default_retriever()
    return retriever_from_url(spec)
