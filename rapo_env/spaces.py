"""`UnicodeText`: a Gymnasium text space that holds any Unicode string, the empty one included.

Gymnasium's `Text` space only admits characters of a fixed charset, and its shared
memory for `AsyncVectorEnv` stores indices into that charset (and is read back only
once), which garbles text. `UnicodeText` accepts every code point and registers
shared-memory handlers that store code points and read them through a live view,
so vector envs carry model text intact with or without shared memory.

Example:
    >>> space = UnicodeText(max_length=16)
    >>> space.contains("∑ x² — ok"), space.contains(""), space.contains("x" * 17)
    (True, True, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from ctypes import c_int32
from multiprocessing.sharedctypes import SynchronizedArray
from types import ModuleType
from typing import Any

import multiprocessing as mp
import numpy as np
from gymnasium.spaces import Text
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

# Characters `sample` draws from: ASCII, accents, maths, CJK, emoji and control characters.
_SAMPLE_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 <>/\\{}()[]=+-*.,;:!?'\"\n\t"
    "éüñçßøå∑∫√π≤≥≠→—你好世界😀\x00\x07"
)


class UnicodeText(Text):
    """Any Unicode string of ``min_length`` to ``max_length`` characters."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        if max_length < min_length or min_length < 0:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length} and {max_length}")
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_ALPHABET, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for every `str` whose length is within bounds, whatever its characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of up to 64 characters from a deliberately mixed alphabet."""
        upper = min(self.max_length, max(self.min_length, 64))
        length = int(self.np_random.integers(self.min_length, upper + 1))
        alphabet = list(_SAMPLE_ALPHABET)
        return "".join(self.np_random.choice(alphabet, size=length)) if length else ""

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    __hash__ = None  # mutable RNG state, as in Gymnasium's spaces


# Shared memory stores code point + 1 per slot; 0 marks the unused tail.
@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> SynchronizedArray:
    return ctx.Array(np.dtype(np.int32).char, n * space.max_length)


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(
    space: UnicodeText, index: int, value: str, shared_memory: SynchronizedArray
) -> None:
    size = space.max_length
    if len(value) > size:
        raise ValueError(f"observation of {len(value)} characters exceeds the space's max_length {size}")
    codes = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int32) + 1
    destination = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size]
    destination[: len(codes)] = codes
    destination[len(codes) :] = 0


class SharedTextBatch(Sequence[str]):
    """A live view of the texts in a vector env's shared memory, decoded on access.

    `AsyncVectorEnv` reads its shared observation buffer once, at construction, and relies on
    that read returning a view (true for arrays). Strings are immutable, so a view object is the
    only way for text; ``deepcopy`` (what the env returns when ``copy=True``) gives a plain tuple.
    """

    def __init__(self, space: UnicodeText, shared_memory: SynchronizedArray, n: int):
        self._rows = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        row = self._rows[index]
        length = int(np.count_nonzero(row))  # code points are stored +1, so only the tail is 0
        return (row[:length] - 1).astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedTextBatch{tuple(self)!r}"


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(
    space: UnicodeText, shared_memory: SynchronizedArray[c_int32], n: int = 1
) -> SharedTextBatch:
    return SharedTextBatch(space, shared_memory, n)
