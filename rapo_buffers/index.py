"""Embed a Step-Trace Buffer's keys and build its FAISS index (spec §3: MiniLM, inner product, HNSW or Flat).

Keys are normalised with `rapo_buffers.text.normalize_context` (the same function queries go
through), embedded in chunks and added to the index as they come, so a 170k-step buffer never
holds more than one chunk of text in the encoder at once. The sidecar (``<index>.json``) records
the model, the count, the normalisation and the `EncoderSpec`, so that a server can refuse a
mismatched buffer and encodes queries exactly like the keys.

Both encoders cut a key that is too long from the left, as `normalize_context` does: the newest part
of a context is what the next step depends on. ``BUFFER_ENCODER`` (paper mode) is MiniLM's mean pooling
over 256 tokens, ``REFERENCE_BUFFER_ENCODER`` the reference's last-token state over 512.

Example:
    >>> import tempfile, os
    >>> from rapo_buffers.schema import StepTrace
    >>> from rapo_tools.search.embedding import BUFFER_ENCODER, REFERENCE_BUFFER_ENCODER, EncoderSpec, Embedder
    >>> from rapo_tools.search.faiss_index import IndexConfig
    >>> traces = [StepTrace(key=f"question {i}", value=f"step {i}", reward=1.0) for i in range(3)]
    >>> path = os.path.join(tempfile.mkdtemp(), "buffer.index")
    >>> meta = build_step_index(traces, path, Embedder(), IndexConfig(kind="flat"), show_progress=False)
    >>> meta["count"], meta["normalization"]["max_chars"], meta["encoder"]["truncation_side"]
    (3, 1300, 'left')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rapo_buffers.schema import StepTrace
from rapo_buffers.text import MAX_CONTEXT_CHARS, normalize_context
from rapo_tools.search.embedding import BUFFER_ENCODER, REFERENCE_BUFFER_ENCODER, EncoderSpec, Embedder
from rapo_tools.search.faiss_index import IndexConfig, build_index, load_sidecar, save_index

INDEX_KIND = "step_trace"
"""The sidecar's ``kind``: tells a step-trace index from a knowledge-search one."""
ENCODINGS = {"paper": BUFFER_ENCODER, "reference": REFERENCE_BUFFER_ENCODER}
"""Key encoders by fidelity mode (``rapo buffer index --encoder``)."""


def step_index_sidecar(
    model_name: str,
    corpus_path: str | os.PathLike[str] | None,
    max_chars: int = MAX_CONTEXT_CHARS,
    encoder: EncoderSpec = BUFFER_ENCODER,
) -> dict[str, Any]:
    """The sidecar fields of a step-trace index (`save_index` adds count, dimension and config)."""
    return {
        "kind": INDEX_KIND,
        "model": model_name,
        "encoder": dataclasses.asdict(encoder),
        "corpus_path": None if corpus_path is None else os.fspath(corpus_path),
        "normalization": {"drop_system_prompt": True, "strip_special_tokens": True, "max_chars": max_chars},
    }


def _embedded_chunks(
    keys: Sequence[str], embedder: Embedder, chunk_size: int, show_progress: bool
) -> Iterator[np.ndarray]:
    with tqdm(total=len(keys), desc="embedding keys", unit="key", disable=not show_progress) as bar:
        for start in range(0, len(keys), chunk_size):
            chunk = keys[start : start + chunk_size]
            yield embedder.encode(chunk)
            bar.update(len(chunk))


def build_step_index(
    traces: Sequence[StepTrace],
    index_path: str | os.PathLike[str],
    embedder: Embedder | None = None,
    config: IndexConfig | None = None,
    corpus_path: str | os.PathLike[str] | None = None,
    max_chars: int = MAX_CONTEXT_CHARS,
    chunk_size: int = 4096,
    show_progress: bool = True,
    encoder: EncoderSpec = BUFFER_ENCODER,
) -> dict[str, Any]:
    """Embed the normalised keys of ``traces``, build the index, save it with its sidecar; return the sidecar.

    Args:
        traces: The buffer's records, in file order (index ids are positions in this list).
        index_path: Where to write the FAISS index (the sidecar goes to ``<index_path>.json``).
        embedder: The sentence encoder; None loads the embedded all-MiniLM-L6-v2.
        config: Index kind and parameters; None = the reference HNSW (M 32, efConstruction 200, efSearch 128).
        corpus_path: The buffer file, recorded in the sidecar.
        max_chars: Characters of normalised key kept (1,300 as in the reference).
        chunk_size: Keys embedded per chunk before being added to the index.
        show_progress: Show tqdm bars.
        encoder: How keys are cut and pooled (`BUFFER_ENCODER`, or `REFERENCE_BUFFER_ENCODER` in reference
            mode); recorded in the sidecar, and queries are encoded by it.

    Raises:
        ValueError: when ``traces`` is empty.
    """
    if not traces:
        raise ValueError("cannot index an empty buffer")
    embedder = (embedder or Embedder()).with_encoder(encoder)
    config = config or IndexConfig(kind="hnsw")
    keys = [normalize_context(trace.key, max_chars) for trace in traces]
    index = build_index(
        _embedded_chunks(keys, embedder, chunk_size, show_progress),
        config,
        total=len(keys),
        show_progress=show_progress,
    )
    save_index(index, index_path, step_index_sidecar(embedder.model_name, corpus_path, max_chars, encoder), config)
    return load_sidecar(index_path)
