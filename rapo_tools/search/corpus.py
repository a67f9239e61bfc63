"""Passage corpora: readers for the reference formats and a random-access passage store.

Formats (detected from the file):

- wiki-18 JSONL, one ``{"id", "contents"}`` per line, where ``contents`` is ``"Title"\\ntext``
  (FlashRAG / Search-R1); also ``{"title", "text"}`` JSONL and KILT's ``{"wikipedia_title", "text": [...]}``.
  JSONL is streamed: 21 M passages never sit in memory as Python objects. A
  `PassageStore` keeps only a ``numpy`` array of byte offsets and reads a passage
  from the file when asked (the offsets can be saved next to an index and memory-mapped).
- JSON: a list of ``{"title", "text"}``, or HotpotQA's dict ``title -> [sentences]`` (or ``title -> text``).

Example:
    >>> import json, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "wiki.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write(json.dumps({"id": "0", "contents": '"Paris"\\nParis is the capital of France.'}) + "\\n")
    >>> [(p.title, p.text) for p in iter_passages(path)]
    [('Paris', 'Paris is the capital of France.')]
    >>> store = open_passage_store(path)
    >>> len(store), store[0].contents
    (1, '"Paris"\\nParis is the capital of France.')
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from rapo_tools.jsonl import JsonlReader, loads_line

logger = logging.getLogger(__name__)

CORPUS_FORMATS = ("auto", "jsonl", "json")


class CorpusFormatError(ValueError):
    """The corpus file is missing, empty, or in none of the supported formats."""


@dataclasses.dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable passage."""

    id: str
    """Stable identifier (the corpus's own id, or the row number)."""
    title: str
    """Article title, without quotes."""
    text: str
    """Passage body."""

    @property
    def contents(self) -> str:
        """The wiki-18 ``contents`` field: the quoted title, a newline, then the text."""
        return f'"{self.title}"\n{self.text}'

    def to_document(self) -> dict[str, str]:
        """The ``document`` object of a ``/wikiSearch`` answer (Search-R1's ``id``/``contents`` plus title and text)."""
        return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}

    @property
    def embedding_text(self) -> str:
        """What gets embedded: title and text, as the reference encodes ``contents``."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def _split_contents(contents: str) -> tuple[str, str]:
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text.strip()


def _join_sentences(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return "".join(str(part) for part in value).strip()
    raise CorpusFormatError(f"passage text must be a string or a list of sentences, got {type(value).__name__}")


def passage_from_record(record: Any, row: int) -> Passage:
    """Turn one JSON record of any supported layout into a `Passage` (``row`` is the fallback id)."""
    if not isinstance(record, dict):
        raise CorpusFormatError(f"record {row} is a {type(record).__name__}, not a JSON object")
    identifier = str(record.get("id", record.get("_id", row)))
    if "contents" in record:
        title, text = _split_contents(str(record["contents"]))
        return Passage(identifier, title, text)
    if "wikipedia_title" in record:  # KILT pages: the first paragraph repeats the title
        paragraphs = record.get("text", [])
        paragraphs = paragraphs[1:] if isinstance(paragraphs, list) and paragraphs else paragraphs
        return Passage(identifier, str(record["wikipedia_title"]), _join_sentences(paragraphs))
    if "text" in record:
        return Passage(identifier, str(record.get("title", "")).strip(), _join_sentences(record["text"]))
    raise CorpusFormatError(f"record {row} has none of the fields 'contents', 'text' (keys: {sorted(record)[:8]})")


def detect_format(path: str | os.PathLike) -> str:
    """``"jsonl"`` or ``"json"``, from the file's first non-blank line (a single JSON value spanning it = JSON)."""
    path = Path(path)
    if not path.is_file():
        raise CorpusFormatError(f"no corpus file at {path}")
    with path.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                value = loads_line(line)
            except ValueError:
                return "json"  # a value that continues past the first line
            if isinstance(value, list):
                return "json"
            if not isinstance(value, dict):
                raise CorpusFormatError(f"{path} starts with a JSON {type(value).__name__}, not a record or a document")
            # One-line JSON documents (a title->sentences dict) are JSON, not JSONL.
            return "jsonl" if any(key in value for key in ("contents", "text", "wikipedia_title")) else "json"
    raise CorpusFormatError(f"the corpus file {path} is empty")


def _resolve_format(path: str | os.PathLike, corpus_format: str) -> str:
    if corpus_format not in CORPUS_FORMATS:
        raise ValueError(f"corpus_format must be one of {CORPUS_FORMATS}, got {corpus_format!r}")
    return detect_format(path) if corpus_format == "auto" else corpus_format


def _iter_json_document(path: Path) -> Iterator[Passage]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise CorpusFormatError(f"{path} is not valid JSON: {error}") from error
    if isinstance(data, dict):
        for row, (title, value) in enumerate(data.items()):
            yield Passage(str(row), str(title), _join_sentences(value))
    elif isinstance(data, list):
        for row, record in enumerate(data):
            yield passage_from_record(record, row)
    else:
        raise CorpusFormatError(f"{path} holds a JSON {type(data).__name__}; expected a list or a title->text dict")


def iter_jsonl_with_offsets(path: str | os.PathLike) -> Iterator[tuple[int, Passage]]:
    """Stream a JSONL corpus as ``(byte offset, passage)``; malformed lines are skipped and counted
    (`rapo_tools.jsonl.JsonlReader`)."""
    good_rows = 0

    def parse(record: Any) -> Passage:
        nonlocal good_rows
        passage = passage_from_record(record, good_rows)  # the fallback id is the passage's row in the store
        good_rows += 1
        return passage

    for _, offset, passage in JsonlReader(path, parse, what="passages").with_positions():
        yield offset, passage


def iter_passages(path: str | os.PathLike, corpus_format: str = "auto") -> Iterator[Passage]:
    """Stream the passages of a corpus file in file order (JSONL lazily; JSON after one parse)."""
    path = Path(path)
    if _resolve_format(path, corpus_format) == "json":
        yield from _iter_json_document(path)
    else:
        for _, passage in iter_jsonl_with_offsets(path):
            yield passage


class PassageStore(Sequence[Passage]):
    """Random access to a corpus's passages by row (the row numbers of the index built over it)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of passages."""

    @abc.abstractmethod
    def passage(self, row: int) -> Passage:
        """The passage at ``row`` (0 <= row < len)."""

    @overload
    def __getitem__(self, row: int) -> Passage: ...

    @overload
    def __getitem__(self, row: slice) -> list[Passage]: ...

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self.passage(i) for i in range(*row.indices(len(self)))]
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"passage row {row} out of range for a corpus of {len(self)}")
        return self.passage(row)

    def close(self) -> None:
        """Release file handles; harmless to call twice."""


class InMemoryPassageStore(PassageStore):
    """Passages held as a list (small corpora, JSON files, generated knowledge bases)."""

    def __init__(self, passages: Iterable[Passage]):
        self._passages = list(passages)

    def __len__(self) -> int:
        return len(self._passages)

    def passage(self, row: int) -> Passage:
        return self._passages[row]


class JsonlPassageStore(PassageStore):
    """Reads passages straight from a memory-mapped JSONL file through a table of line offsets."""

    def __init__(self, path: str | os.PathLike, offsets: np.ndarray):
        self.path = Path(path)
        self.offsets = offsets
        self._file = self.path.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def __len__(self) -> int:
        return len(self.offsets)

    def passage(self, row: int) -> Passage:
        start = int(self.offsets[row])
        end = self._map.find(b"\n", start)
        line = self._map[start : end if end >= 0 else len(self._map)]
        return passage_from_record(loads_line(line), row)

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            self._file.close()


def scan_offsets(path: str | os.PathLike, show_progress: bool = False) -> np.ndarray:
    """Byte offsets of the well-formed passages of a JSONL corpus (one pass over the file)."""
    from tqdm.auto import tqdm

    offsets = [
        offset for offset, _ in tqdm(iter_jsonl_with_offsets(path), desc="scanning corpus", disable=not show_progress)
    ]
    return np.asarray(offsets, dtype=np.int64)


def offsets_path(index_path: str | os.PathLike) -> Path:
    """Where an index keeps the line offsets of its JSONL corpus."""
    return Path(f"{index_path}.offsets.npy")


def open_passage_store(
    path: str | os.PathLike,
    corpus_format: str = "auto",
    offsets: np.ndarray | str | os.PathLike | None = None,
) -> PassageStore:
    """Open a corpus for random access.

    JSONL is read through line offsets (given, loaded from a ``.npy``, or scanned); JSON is held in memory.
    """
    path = Path(path)
    if _resolve_format(path, corpus_format) == "json":
        return InMemoryPassageStore(_iter_json_document(path))
    if offsets is None:
        table = scan_offsets(path)
    elif isinstance(offsets, np.ndarray):
        table = offsets
    else:
        table = np.load(offsets, mmap_mode="r")
    return JsonlPassageStore(path, table)
