"""A disk cache of search results that many processes can read and write at once.

SQLite in WAL mode: readers never block, concurrent writers queue on SQLite's lock
(``busy_timeout``) instead of failing, and a crash mid-write never leaves a torn
entry. Keys are hashes of (provider, endpoint, query, top-k), so that two providers
or two endpoints never answer for each other.

Example:
    >>> import tempfile, os
    >>> from rapo_tools.web.results import SearchResult
    >>> cache = SearchCache(os.path.join(tempfile.mkdtemp(), "search.sqlite"))
    >>> key = cache.key("bing", "https://api.bing.microsoft.com/v7.0/search", "ada lovelace", 10)
    >>> cache.put(key, [SearchResult("Ada", "https://a.example", "mathematician")])
    >>> cache.get(key)[0].title
    'Ada'
    >>> cache.close()
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from rapo_tools.web.results import SearchResult

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    query TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class ThreadConnections:
    """SQLite connections to one WAL-mode file, one per thread of each process, made on first use.

    Args:
        path: The SQLite file; its folder is created.
        schema: SQL run once at start (``CREATE TABLE IF NOT EXISTS ...``).
        busy_timeout_s: How long a writer waits for another process's write lock before giving up.
    """

    def __init__(self, path: Path, schema: str, busy_timeout_s: float = 30.0):
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        connection = self.get()
        self._enable_wal(connection)
        connection.execute(schema)
        connection.commit()

    def _enable_wal(self, connection: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL takes an exclusive lock, and SQLite answers "database is locked" at once
        # (without its busy handler) while another process is doing the same: retry until the busy timeout.
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def get(self) -> sqlite3.Connection:
        """This thread's connection."""
        # sqlite3 connections must cross neither threads nor forks: each thread of each process opens its own.
        connection = getattr(self._local, "connection", None)
        if connection is None or getattr(self._local, "pid", None) != os.getpid():
            connection = sqlite3.connect(self.path, timeout=self._busy_timeout_s, check_same_thread=False)
            connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
            self._local.connection, self._local.pid = connection, os.getpid()
            with self._lock:
                self._opened.append(connection)
        return connection

    def close(self) -> None:
        """Close every connection opened so far."""
        with self._lock:
            connections, self._opened = self._opened, []
        for connection in connections:
            connection.close()
        self._local = threading.local()


class SearchCache:
    """Search results on disk, keyed by `SearchCache.key`.

    Args:
        path: The SQLite file; its folder is created.
        busy_timeout_s: How long a writer waits for another process's write lock before giving up.
    """

    def __init__(self, path: str | Path, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self._connections = ThreadConnections(self.path, _SCHEMA, busy_timeout_s)

    @staticmethod
    def key(provider: str, endpoint: str, query: str, top_k: int) -> str:
        """The cache key of one request."""
        material = json.dumps([provider, endpoint, " ".join(query.split()), int(top_k)], ensure_ascii=False)
        return hashlib.sha256(material.encode("utf-8")).hexdigest()

    def get(self, key: str) -> list[SearchResult] | None:
        """The stored results, or None when absent or unreadable (a corrupt row is a miss, not a crash)."""
        try:
            row = self._connections.get().execute("SELECT payload FROM results WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as error:
            logger.warning("search cache %s unreadable: %s", self.path, error)
            return None
        if row is None:
            return None
        try:
            return [SearchResult.from_dict(item) for item in json.loads(row[0])]
        except (ValueError, TypeError, AttributeError) as error:
            logger.warning("search cache entry %s is corrupt (%s); ignoring it", key[:12], error)
            return None

    def put(self, key: str, results: list[SearchResult], provider: str = "", query: str = "") -> None:
        """Store ``results`` under ``key`` (last writer wins; a failed write is logged, not raised)."""
        payload = json.dumps([hit.to_dict() for hit in results], ensure_ascii=False)
        connection = self._connections.get()
        try:
            with connection:
                connection.execute(
                    "INSERT OR REPLACE INTO results (key, provider, query, payload, created) VALUES (?, ?, ?, ?, ?)",
                    (key, provider, query, payload, time.time()),
                )
        except sqlite3.Error as error:
            logger.warning("search cache %s not written: %s", self.path, error)

    def __len__(self) -> int:
        return int(self._connections.get().execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        """Close every connection this object opened (one per thread that used it)."""
        self._connections.close()
