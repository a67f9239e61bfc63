"""The in-process step-trace retriever: normalise queries, embed them, search the FAISS index.

It implements `rapo_buffers.candidates.Retriever`, so a trainer can hand it straight to
`rapo_env.wrappers.StepTraceRetrievalWrapper` without any service; the ``/retrieve`` service
wraps the same object.

Example:
    >>> import tempfile, os
    >>> from rapo_buffers.index import build_step_index
    >>> from rapo_buffers.schema import StepTrace
    >>> from rapo_tools.search.embedding import BUFFER_ENCODER, EncoderSpec, Embedder
    >>> from rapo_tools.search.faiss_index import IndexConfig, load_index
    >>> traces = [StepTrace(key="How many legs do 3 cats have?", value="<python>3*4</python>", reward=1.0),
    ...           StepTrace(key="What is the capital of France?", value="<search>France capital</search>", reward=1.0)]
    >>> path = os.path.join(tempfile.mkdtemp(), "buffer.index")
    >>> embedder = Embedder()
    >>> _ = build_step_index(traces, path, embedder, IndexConfig(kind="flat"), show_progress=False)
    >>> retriever = InProcessRetriever(traces, load_index(path)[0], embedder)
    >>> retriever.retrieve(["How many legs do 5 cats have?"], topk=1)[0][0].value
    '<python>3*4</python>'
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from rapo_buffers.candidates import Candidate
from rapo_buffers.index import INDEX_KIND
from rapo_buffers.schema import StepTrace, read_buffer
from rapo_buffers.text import MAX_CONTEXT_CHARS, normalize_context
from rapo_tools.search.embedding import BUFFER_ENCODER, EncoderSpec, Embedder
from rapo_tools.search.faiss_index import IndexFileError, load_index

logger = logging.getLogger(__name__)


class InProcessRetriever:
    """Top-k step traces for a batch of queries, computed in this process.

    Args:
        traces: The buffer's records; index id ``i`` is ``traces[i]``.
        index: A FAISS index over the normalised keys (inner product on L2-normalised vectors).
        embedder: The model the index was built with.
        max_chars: Characters of normalised query kept; must match the keys' (the sidecar's value).
        encoder: How queries are cut and pooled; must match the keys' (the sidecar's ``encoder``).
    """

    def __init__(
        self,
        traces: Sequence[StepTrace],
        index: Any,
        embedder: Embedder,
        max_chars: int = MAX_CONTEXT_CHARS,
        encoder: EncoderSpec = BUFFER_ENCODER,
    ):
        if int(index.ntotal) != len(traces):
            raise IndexFileError(f"the index holds {index.ntotal} vectors but the buffer has {len(traces)} steps")
        self.traces = list(traces)
        self.index = index
        self.embedder = embedder.with_encoder(encoder)
        self.max_chars = max_chars

    @classmethod
    def from_files(
        cls,
        corpus_path: str | os.PathLike[str],
        index_path: str | os.PathLike[str],
        embedder: Embedder | None = None,
        mmap: bool = True,
    ) -> InProcessRetriever:
        """Load a buffer JSONL and its index (memory-mapped); the embedder defaults to the sidecar's model,
        and queries are encoded by the sidecar's `EncoderSpec`.

        Raises:
            IndexFileError: when the index is missing, corrupt, or does not match the buffer.
            FileNotFoundError: when the buffer file is missing.
        """
        index, sidecar = load_index(index_path, mmap=mmap)
        if sidecar.get("kind", INDEX_KIND) != INDEX_KIND:
            raise IndexFileError(f"{index_path} is a {sidecar.get('kind')!r} index, not a step-trace index")
        traces, stats = read_buffer(corpus_path)
        if stats.skipped:
            logger.info("%s: skipped %d lines that are not step records", corpus_path, stats.skipped)
        if embedder is None:
            embedder = Embedder(sidecar.get("model"))
        elif sidecar.get("model") and sidecar["model"] != embedder.model_name:
            logger.warning(
                "index %s was built with %s, queries use %s", index_path, sidecar["model"], embedder.model_name
            )
        max_chars = int(sidecar.get("normalization", {}).get("max_chars", MAX_CONTEXT_CHARS))
        # An index from before encoders were recorded was built by the right-cutting default.
        return cls(traces, index, embedder, max_chars, EncoderSpec.from_dict(sidecar.get("encoder")))

    def retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        """For each query, up to ``topk`` candidates, best first.

        Raises:
            ValueError: when ``topk`` < 1.
        """
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        vectors = self.embedder.encode([normalize_context(query, self.max_chars) for query in queries])
        scores, ids = self.index.search(vectors, min(topk, len(self.traces)))
        results: list[list[Candidate]] = []
        for row_scores, row_ids in zip(scores, ids, strict=True):
            results.append(
                [
                    Candidate(
                        value=self.traces[i].value,
                        reward=self.traces[i].reward,
                        score=float(score),
                        is_final=self.traces[i].final,
                    )
                    for score, i in zip(row_scores, row_ids, strict=True)
                    if i >= 0  # FAISS pads with -1 when fewer than topk neighbours exist
                ]
            )
        return results


class RandomRetriever:
    """Step traces drawn uniformly at random from a buffer, whatever the query: the paper's random-retrieval
    ablation (RAPO should stay ahead of GRPO even when the spliced step is unrelated to the rollout).

    Scores are 0.0 (no similarity was computed); each query gets ``topk`` distinct traces.

    Args:
        traces: The buffer's records.
        seed: Seed of the draws.

    Example:
        >>> from rapo_buffers.schema import StepTrace
        >>> traces = [StepTrace(key=str(i), value=f"<python>{i}</python>", reward=1.0) for i in range(5)]
        >>> [len(row) for row in RandomRetriever(traces, seed=0).retrieve(["a", "b"], topk=2)]
        [2, 2]
    """

    def __init__(self, traces: Sequence[StepTrace], seed: int = 0):
        import numpy as np

        if not traces:
            raise ValueError("random retrieval needs a buffer with at least one step trace")
        self.traces = list(traces)
        self._rng = np.random.default_rng(seed)

    @classmethod
    def over(cls, retriever_factory: Any, seed: int = 0) -> RandomRetriever:
        """Random draws from the traces of the in-process retriever ``retriever_factory()`` builds (picklable
        with a picklable factory).

        Raises:
            TypeError: when that retriever holds no traces in this process (a ``/retrieve`` service).
        """
        retriever = retriever_factory()
        if not hasattr(retriever, "traces"):
            raise TypeError(f"random retrieval needs an in-process buffer, not a {type(retriever).__name__}")
        return cls(retriever.traces, seed)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        """``topk`` random candidates (at most the buffer's size) for each query."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        count = min(topk, len(self.traces))
        return [[Candidate(value=trace.value, reward=trace.reward, score=0.0, is_final=trace.final)
                 for trace in (self.traces[i] for i in self._rng.choice(len(self.traces), count, replace=False))]
                for _ in queries]
