"""Replay recorded search results: the reference's cache file, offline and deterministic.

The reference (ARPO) cache is one JSON object mapping each query it sent to the text
its Bing tool returned: ``"Page 1: snippet\\nPage 2: snippet..."``, or
``"No search results found."`` when Bing had nothing. Values that are lists of
``{"title", "url", "snippet"}`` objects are read too.

A query is looked up exactly first, then by a normalised form (case, spacing and a
leading ``search query:`` prefix ignored, since the reference's agents wrote queries
both with and without it). A query that is not recorded raises `ReplayMissError`:
a miss is reported, never answered with invented or nearest-neighbour results.

Example:
    >>> import json, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "cache.json")
    >>> _ = open(path, "w").write(json.dumps({"search query: Ada Lovelace": "Page 1: A mathematician."}))
    >>> provider = ReplayProvider(path)
    >>> from rapo_tools.aio import run_sync
    >>> run_sync(provider.search("ada  lovelace", 10))[0].snippet
    'A mathematician.'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rapo_tools.web.providers.base import ReplayMissError, SearchProvider
from rapo_tools.web.results import NO_RESULTS_TEXT, SearchResult

_PAGE_MARKER = re.compile(r"(?m)^Page \d+: ")
_QUERY_PREFIX = re.compile(r"^\s*search query\s*:\s*", re.IGNORECASE)


def normalize_query(query: str) -> str:
    """The lookup form of a query: prefix ``search query:`` dropped, case folded, spaces collapsed."""
    return " ".join(_QUERY_PREFIX.sub("", query).casefold().split())


def parse_reference_text(text: str) -> list[SearchResult]:
    """Split the reference tool's ``Page i: ...`` text into results (snippet only: it recorded no titles or URLs)."""
    if text.strip() == NO_RESULTS_TEXT:
        return []
    pieces = _PAGE_MARKER.split(text)
    # Text before the first marker is not a page; a recording without markers is one page.
    snippets = pieces[1:] if len(pieces) > 1 else pieces
    return [SearchResult(title="", url="", snippet=piece.strip()) for piece in snippets if piece.strip()]


def _parse_value(value: Any) -> list[SearchResult]:
    if isinstance(value, str):
        return parse_reference_text(value)
    if isinstance(value, list):
        return [SearchResult.from_dict(item) for item in value if isinstance(item, dict)]
    raise ValueError(f"a recorded value must be text or a list of results, got {type(value).__name__}")


class ReplayProvider(SearchProvider):
    """Answers from a recorded query -> results map.

    Args:
        path: A JSON file in the reference cache format (see the module docstring).
    """

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.endpoint = f"replay:{self.path.resolve()}"
        try:
            recorded = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise FileNotFoundError(f"replay file {self.path} does not exist") from error
        except ValueError as error:
            raise ValueError(f"replay file {self.path} is not valid JSON: {error}") from error
        if not isinstance(recorded, dict):
            raise ValueError(f"replay file {self.path} must hold a JSON object (query -> results)")
        self._exact: dict[str, Any] = recorded
        self._normalized: dict[str, Any] = {}
        for query, value in recorded.items():
            self._normalized.setdefault(normalize_query(query), value)

    def __len__(self) -> int:
        return len(self._exact)

    def lookup(self, query: str) -> list[SearchResult] | None:
        """All recorded results of ``query``, or None when it was never recorded."""
        if query in self._exact:
            return _parse_value(self._exact[query])
        value = self._normalized.get(normalize_query(query))
        return None if value is None else _parse_value(value)

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        results = self.lookup(query)
        if results is None:
            raise ReplayMissError(
                f"the query {query!r} is not in the recorded results ({self.path.name}); "
                "replay cannot search the live web"
            )
        return results[:top_k]
