"""`PrefixCache`: the keys and values of recently decoded sequences, kept so that later contexts skip their prefix.

A multi-turn episode asks the policy for a continuation of the previous turn's context, its generated tokens
and what the env appended (a tool result, a hint, a splice), and the rollouts of a batch share their system
prompt. The KV of a token depends only on the tokens before it, so any stored sequence that agrees with a new
context on its first ``n`` tokens holds that context's KV for those ``n`` tokens; `FastPolicy` then prefills
only the rest (what vLLM calls automatic prefix caching). Entries live in an LRU store bounded by bytes;
an entry that is a prefix of a newer one is dropped, since the newer one holds all it held.

`shared_prefixes` finds what the contexts of one batch share, so that it is prefilled once, not once a row;
`PrefillStats` counts the prompt tokens that were prefilled and those that were reused.

Example:
    >>> import torch
    >>> store = PrefixCache(max_bytes=1 << 20)
    >>> kv = torch.zeros(2, 1, 5, 4)  # [layers, kv_heads, tokens, head_dim]
    >>> store.insert([1, 2, 3, 4, 5], kv, kv)
    >>> match = store.lookup([1, 2, 3, 9])
    >>> match.length, tuple(match.keys.shape)
    (3, (2, 1, 3, 4))
    >>> store.lookup([7, 8]) is None
    True
    >>> shared_prefixes([[1, 2, 3, 4], [1, 2, 3, 5], [9]], min_length=2)
    [[1, 2, 3]]
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two int arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def shared_prefixes(sequences: Sequence[Sequence[int]], min_length: int) -> list[list[int]]:
    """The distinct longest prefixes that each sequence shares with another one, of at least ``min_length`` tokens.

    In lexicographic order, a sequence's longest common prefix with any other is the one with a neighbour, so
    one sort finds them all (the system prompt of a batch, or the whole prompt of a group's rollouts).
    """
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    arrays = [np.asarray(sequences[i], dtype=np.int64) for i in order]
    between = [common_prefix_length(a, b) for a, b in zip(arrays[:-1], arrays[1:], strict=True)]
    found: dict[tuple[int, ...], None] = {}
    for rank, array in enumerate(arrays):
        length = max(between[rank - 1] if rank > 0 else 0, between[rank] if rank < len(between) else 0)
        if length >= min_length:
            found[tuple(array[:length].tolist())] = None
    return [list(prefix) for prefix in found]


@dataclasses.dataclass(eq=False)
class Entry:
    """One stored sequence: its tokens and their keys and values, ``[layers, kv_heads, tokens, head_dim]`` each."""

    tokens: np.ndarray
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@dataclasses.dataclass(frozen=True)
class Match:
    """The first ``length`` tokens of a context, found in ``entry``."""

    entry: Entry
    length: int

    @property
    def keys(self) -> torch.Tensor:
        return self.entry.keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.entry.values[:, :, : self.length]


class PrefixCache:
    """An LRU store of the KV of decoded sequences, bounded by ``max_bytes``; `lookup` finds the longest prefix.

    Args:
        max_bytes: most bytes of keys and values held (0: store nothing). An entry larger than this is not kept.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id(entry) -> entry, least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> Match | None:
        """The stored entry sharing the most leading tokens with ``tokens`` (at most ``limit``), or None.

        The entry found becomes the most recently used.
        """
        if not self._entries:
            return None
        query = np.asarray(tokens, dtype=np.int64)
        if limit is not None:
            query = query[:limit]
        best, best_length = None, 0
        for entry in self._entries.values():
            length = common_prefix_length(entry.tokens, query)
            if length > best_length:
                best, best_length = entry, length
        if best is None:
            return None
        self._entries.move_to_end(id(best))
        return Match(best, best_length)

    def insert(self, tokens: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep ``keys`` and ``values`` (``[layers, kv_heads, len(tokens), head_dim]``, not copied) of ``tokens``.

        Entries that ``tokens`` extends are dropped; an entry that already extends ``tokens`` is only marked used.
        Least recently used entries leave until the store fits ``max_bytes`` again.
        """
        if keys.shape[2] != len(tokens) or values.shape != keys.shape:
            raise ValueError(f"keys and values must hold {len(tokens)} tokens, got {tuple(keys.shape)} and "
                             f"{tuple(values.shape)}")
        entry = Entry(np.asarray(tokens, dtype=np.int64), keys, values)
        if entry.nbytes > self.max_bytes:
            return
        for key, old in list(self._entries.items()):
            length = common_prefix_length(old.tokens, entry.tokens)
            if length == len(entry.tokens):  # an entry as long or longer already holds it all
                self._entries.move_to_end(key)
                return
            if length == len(old.tokens):
                self._remove(key)
        self._entries[id(entry)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry (the weights changed, so every stored KV is stale)."""
        self._entries.clear()
        self.nbytes = 0

    def _remove(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


@dataclasses.dataclass
class PrefillStats:
    """Prompt tokens of every generated row, summed over calls: how many ran through the model, how many were reused.

    ``prefilled_tokens`` also counts the shared prefixes run once for a batch, so without any reuse it equals
    ``prompt_tokens``; padding is not counted.
    """

    prompt_tokens: int = 0
    """Context tokens of every row asked for."""
    prefilled_tokens: int = 0
    """Tokens that prefill forwards ran (the rows' own new tokens and the shared prefixes)."""
    reused_tokens: int = 0
    """Context tokens whose KV came from the `PrefixCache`."""

    @property
    def reused_fraction(self) -> float:
        """Share of the prompt tokens that were not prefilled for their own row (0 before any call)."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "reused_fraction": self.reused_fraction}
