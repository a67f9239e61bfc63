"""`WikiSearch`: dense passage search in-process (encoder + FAISS index + passage store).

Build an index over a corpus file with `build_corpus_index` (streamed: the corpus is read,
encoded and added chunk by chunk), then `WikiSearch.load` it; or index a small list of
passages in memory with `WikiSearch.from_passages`.

Example:
    >>> from rapo_tools.search.corpus import Passage
    >>> search = WikiSearch.from_passages([
    ...     Passage("0", "Paris", "Paris is the capital of France."),
    ...     Passage("1", "Mount Fuji", "Mount Fuji is the highest mountain in Japan."),
    ... ])
    >>> search.search(["tallest peak in Japan"], topk=1)[0][0].passage.title
    'Mount Fuji'
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rapo_tools.search.corpus import (
    InMemoryPassageStore,
    Passage,
    PassageStore,
    detect_format,
    iter_jsonl_with_offsets,
    iter_passages,
    offsets_path,
    open_passage_store,
)
from rapo_tools.search.embedding import SEARCH_ENCODER, EncoderSpec, Embedder
from rapo_tools.search.faiss_index import (
    IndexConfig,
    IndexFileError,
    build_index,
    load_index,
    save_index,
    to_gpu,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SearchHit:
    """One ranked passage."""

    passage: Passage
    """The passage found."""
    score: float
    """Similarity (inner product of normalised vectors = cosine, for the default metric)."""
    row: int
    """Row of the passage in the index and corpus."""

    def to_result(self) -> dict[str, Any]:
        """The reference ``{"document": ..., "score": ...}`` entry of a ``/wikiSearch`` answer."""
        return {"document": self.passage.to_document(), "score": self.score}


EMBEDDED_TEXTS = ("title_text", "contents")
"""What `build_corpus_index` embeds of a passage: ``title_text`` (title, newline, text: the paper mode) or
``contents`` (the raw wiki-18 ``contents`` string, title in quotes: the reference)."""


def embedded_text(passage: Passage, field: str) -> str:
    """The text of ``passage`` that an index built with ``field`` (one of `EMBEDDED_TEXTS`) embeds."""
    return passage.contents if field == "contents" else passage.embedding_text


def _count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def build_corpus_index(
    corpus_path: str | os.PathLike,
    index_path: str | os.PathLike,
    embedder: Embedder | None = None,
    config: IndexConfig | None = None,
    chunk_size: int = 4_096,
    corpus_format: str = "auto",
    show_progress: bool = True,
    encoder: EncoderSpec | None = None,
    embed: str = "title_text",
) -> dict[str, Any]:
    """Encode a corpus file and save a FAISS index of it (plus its sidecar, and line offsets for JSONL).

    The corpus is streamed in chunks of ``chunk_size`` passages: memory holds one chunk of
    texts and the index, never the whole corpus. ``encoder`` (default: the embedder's own spec)
    and ``embed`` (one of `EMBEDDED_TEXTS`) are recorded in the sidecar; `WikiSearch.load` encodes
    queries with the same spec. The reference mode is ``encoder=REFERENCE_SEARCH_ENCODER, embed="contents"``.

    Returns:
        The sidecar written next to the index.
    """
    if embed not in EMBEDDED_TEXTS:
        raise ValueError(f"embed must be one of {EMBEDDED_TEXTS}, got {embed!r}")
    corpus_path = Path(corpus_path)
    embedder = embedder or Embedder()
    if encoder is not None:
        embedder = embedder.with_encoder(encoder)
    config = config or IndexConfig()
    fmt = detect_format(corpus_path) if corpus_format == "auto" else corpus_format
    offsets: list[int] = []
    if fmt == "jsonl":
        total = _count_lines(corpus_path)

        def passages() -> Iterator[Passage]:
            for offset, passage in iter_jsonl_with_offsets(corpus_path):
                offsets.append(offset)
                yield passage

        stream: Iterable[Passage] = passages()
    else:
        stream = list(iter_passages(corpus_path, "json"))
        total = len(stream)
    vectors = (embedder.encode([embedded_text(p, embed) for p in chunk]) for chunk in _chunks(stream, chunk_size))
    index = build_index(vectors, config, total=total, show_progress=show_progress)
    sidecar = {
        "model": embedder.model_name,
        "normalize": embedder.normalize,
        "encoder": dataclasses.asdict(embedder.encoder),
        "embed": embed,
        "corpus_path": str(corpus_path.resolve()),
        "corpus_format": fmt,
    }
    save_index(index, index_path, sidecar, config)
    if fmt == "jsonl":
        np.save(offsets_path(index_path), np.asarray(offsets, dtype=np.int64))
    return {**sidecar, "dimension": index.d, "count": index.ntotal}


class WikiSearch:
    """Encoder + FAISS index + passage store, answering batches of queries.

    Args:
        index: A FAISS index whose row ``i`` is the vector of ``passages[i]``.
        passages: The passages, in index order.
        embedder: Encodes queries with the model the index was built with.
        sidecar: The index's metadata (reported by ``/health``).
    """

    def __init__(self, index: Any, passages: PassageStore, embedder: Embedder, sidecar: dict[str, Any] | None = None):
        if index.ntotal != len(passages):
            raise IndexFileError(f"the index holds {index.ntotal} vectors but the corpus has {len(passages)} passages")
        if index.d != embedder.dimension:
            raise IndexFileError(f"the index has dimension {index.d} but the encoder gives {embedder.dimension}")
        self.index = index
        self.passages = passages
        self.embedder = embedder
        self.sidecar = sidecar or {}

    @classmethod
    def load(
        cls,
        index_path: str | os.PathLike,
        corpus_path: str | os.PathLike | None = None,
        embedder: Embedder | None = None,
        mmap: bool = True,
        use_gpu: bool = False,
    ) -> WikiSearch:
        """Open an index saved by `build_corpus_index`; the corpus defaults to the one in its sidecar.

        The encoder defaults to the model named in the sidecar (a different model of the
        same dimension is accepted with a warning: scores would be meaningless). Queries are
        always encoded by the sidecar's `EncoderSpec` (pooling, length, truncation side), whatever
        the embedder passed in was set to.
        """
        index, sidecar = load_index(index_path, mmap=mmap)
        corpus = Path(corpus_path or sidecar.get("corpus_path", ""))
        if not corpus.is_file():
            raise IndexFileError(f"the corpus {corpus} of index {index_path} is missing; pass corpus_path")
        saved_offsets = offsets_path(index_path)
        store = open_passage_store(
            corpus, sidecar.get("corpus_format", "auto"), saved_offsets if saved_offsets.is_file() else None
        )
        if embedder is None:
            embedder = Embedder(sidecar.get("model"), normalize=bool(sidecar.get("normalize", True)))
        elif sidecar.get("model") and sidecar["model"] != embedder.model_name:
            logger.warning(
                "index %s was built with %s, queries use %s", index_path, sidecar["model"], embedder.model_name
            )
        embedder = embedder.with_encoder(EncoderSpec.from_dict(sidecar.get("encoder")))
        return cls(to_gpu(index) if use_gpu else index, store, embedder, sidecar)

    @classmethod
    def from_passages(
        cls,
        passages: Sequence[Passage],
        embedder: Embedder | None = None,
        config: IndexConfig | None = None,
        show_progress: bool = False,
        encoder: EncoderSpec = SEARCH_ENCODER,
        embed: str = "title_text",
    ) -> WikiSearch:
        """Index a list of passages in memory (exact search by default); ``encoder`` and ``embed`` as in
        `build_corpus_index`."""
        embedder = (embedder or Embedder()).with_encoder(encoder)
        config = config or IndexConfig(kind="flat")
        vectors = embedder.encode([embedded_text(p, embed) for p in passages], show_progress=show_progress)
        index = build_index(vectors, config, show_progress=show_progress)
        sidecar = {
            "model": embedder.model_name,
            "encoder": dataclasses.asdict(encoder),
            "embed": embed,
            "config": dataclasses.asdict(config),
        }
        return cls(index, InMemoryPassageStore(passages), embedder, sidecar)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[SearchHit]]:
        """Rank passages for each query: one encode and one FAISS search for the whole batch."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        vectors = self.embedder.encode(list(queries))
        scores, rows = self.index.search(vectors, min(topk, len(self.passages)))
        # FAISS pads with row -1 when fewer than topk vectors are reachable.
        return [
            [
                SearchHit(self.passages[int(row)], float(score), int(row))
                for score, row in zip(score_row, row_row, strict=True)
                if row >= 0
            ]
            for score_row, row_row in zip(scores, rows, strict=True)
        ]

    def search_results(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        """`search` in the reference JSON shape; the batch function of the ``/wikiSearch`` service."""
        return [[hit.to_result() for hit in hits] for hits in self.search(queries, topk)]

    def info(self) -> dict[str, Any]:
        """What ``/health`` reports about this backend."""
        return {
            "passages": len(self.passages),
            "dimension": int(self.index.d),
            "model": self.sidecar.get("model", self.embedder.model_name),
            "encoder": dataclasses.asdict(self.embedder.encoder),
            "embed": self.sidecar.get("embed", "title_text"),
            "index": self.sidecar.get("config", {}).get("kind", type(self.index).__name__),
        }

    def close(self) -> None:
        """Release the corpus file."""
        self.passages.close()
