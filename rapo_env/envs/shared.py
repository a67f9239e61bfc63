"""`SHARED`: the one process-wide store of what rapo's envs share (loaded search indexes, the offline web site),
`shared_wiki_search`, the search index of the QA and web envs taken from it, and `shared_knowledge_base`, the
generated knowledge base of the QA env.

Many envs of one process (a vector env, a rollout engine's pool) use the same heavy resource: a FAISS index
with its encoder, or a loopback site. Each is built once per process under its key and handed to every env
that asks; a forked child builds its own (a server or a thread pool does not survive a fork). A resource
with a lifetime is reference-counted: `ProcessCache.acquire` / `ProcessCache.release`, and the last release
closes it.

Example:
    >>> cache = ProcessCache()
    >>> built = []
    >>> first = cache.get(("index", 1), lambda: built.append(1) or "the index")
    >>> cache.get(("index", 1), lambda: built.append(2) or "another")
    'the index'
    >>> built
    [1]
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from rapo_env.tasks.knowledge_base import KnowledgeBase, KnowledgeBaseConfig
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.wiki_search import WikiSearch


@dataclasses.dataclass
class _Entry:
    value: Any
    pid: int
    users: int = 0


class ProcessCache:
    """Values built once per process and key; see the module docstring."""

    def __init__(self) -> None:
        # Re-entrant: building one resource may fetch another (the offline web loads its search index).
        self._lock = threading.RLock()
        self._entries: dict[Hashable, _Entry] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value under ``key``, built by ``build()`` on first use in this process; it lives as long as the
        process."""
        with self._lock:
            return self._entry(key, build).value

    def acquire(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Like `get`, counting one more user; pair it with `release`."""
        with self._lock:
            entry = self._entry(key, build)
            entry.users += 1
            return entry.value

    def release(self, key: Hashable, close: Callable[[Any], None]) -> None:
        """One user fewer; the last one drops the value and calls ``close(value)`` (outside the lock)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.pid != os.getpid():
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
        close(entry.value)

    def _entry(self, key: Hashable, build: Callable[[], Any]) -> _Entry:
        entry = self._entries.get(key)
        if entry is None or entry.pid != os.getpid():  # a forked child builds its own
            entry = self._entries[key] = _Entry(build(), os.getpid())
        return entry


SHARED = ProcessCache()
"""The process's store, used by every rapo env."""


def shared_knowledge_base(
    seed: int, cache_root: Path, config: KnowledgeBaseConfig | None, embedder: Embedder | None = None
) -> tuple[KnowledgeBase, Path]:
    """One read `KnowledgeBase.cached` (the base and its index path) per seed, sizes and cache folder per process
    (`SHARED`), shared by every env: the 64 envs of a held-out evaluation read 3,000 passages and 4,000 questions
    once, not 64 times (6 s an evaluation). A base is never changed after it is built."""
    key = ("knowledge_base", str(Path(cache_root).resolve()), seed, config, id(embedder))
    return SHARED.get(key, lambda: KnowledgeBase.cached(seed, cache_root, embedder, config))


def shared_wiki_search(
    index_path: Path, corpus_path: Path | None = None, embedder: Embedder | None = None
) -> WikiSearch:
    """One loaded `WikiSearch` per index per process (`SHARED`), shared by every env: vector envs load the model
    once."""
    key = ("wiki_search", str(Path(index_path).resolve()), str(corpus_path or ""), id(embedder))
    return SHARED.get(key, lambda: WikiSearch.load(index_path, corpus_path, embedder))
