"""JSON Lines, read and written one way across rapo: orjson, one policy for bad lines, atomic rewrites.

- Reading skips a bad line and counts it, with its line number: a torn last line (a crash mid-append),
  a line that is not JSON, or a record that ``parse`` refuses. One warning per file names how many and
  where the first was; `JsonlReader.skipped` has them all.
- Writing a whole file is atomic: a temporary file in the same folder, fsynced, renamed into place, so
  a reader sees the old file or the new one, never half of one. Appending adds whole lines in one write.
- orjson decodes several times faster than ``json`` (3.9x on passage lines). Lines it refuses (``NaN``,
  integers beyond 64 bits, which older ``json.dumps`` output may hold) are read by ``json`` instead.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
    >>> write_jsonl(path, [{"id": 1}, {"id": 2}])
    2
    >>> _ = open(path, "a").write('{"id": 3, "torn\\n')
    >>> reader = JsonlReader(path)
    >>> [row["id"] for row in reader], [number for number, _reason in reader.skipped]
    ([1, 2], [3])
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

logger = logging.getLogger(__name__)

T = TypeVar("T")
_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_BAD_RECORD = (ValueError, TypeError, KeyError, AttributeError)
"""What a ``parse`` function raises for a line that is JSON but not a record of its kind."""


def dumps_line(record: Any) -> bytes:
    """One JSONL line (UTF-8, newline included); numpy values and non-string keys are accepted."""
    return orjson.dumps(record, option=_OPTIONS)


def loads_line(line: bytes | str) -> Any:
    """The value of one JSONL line (orjson, else ``json`` for NaN and huge integers); raises ``ValueError``."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as fast_error:
        try:
            return json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"not JSON: {fast_error}") from None


class JsonlReader(Generic[T]):
    """The records of a JSONL file, bad lines skipped and counted (see the module docstring).

    Args:
        path: The file; a missing one raises ``FileNotFoundError`` when iterated.
        parse: Turns each JSON value into a record; what it raises (``ValueError``, ``TypeError``,
            ``KeyError``, ``AttributeError``) marks the line bad. None yields the JSON values.
        what: What the records are, for the warning ("trajectory records").
    """

    def __init__(self, path: str | os.PathLike[str], parse: Callable[[Any], T] | None = None, what: str = "records"):
        self.path = Path(path)
        self.parse = parse
        self.what = what
        self.lines = 0
        """Non-blank lines read."""
        self.skipped: list[tuple[int, str]] = []
        """(line number, reason) of every bad line."""

    def __iter__(self) -> Iterator[T]:
        for _, _, record in self.with_positions():
            yield record

    def with_positions(self) -> Iterator[tuple[int, int, T]]:
        """``(line number from 1, byte offset of the line, record)`` for every good line: where it came from, and
        where to seek to read it again."""
        self.lines, self.skipped = 0, []
        offset = 0
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                self.lines += 1
                try:
                    value = loads_line(line)
                    record = self.parse(value) if self.parse is not None else value
                except _BAD_RECORD as error:
                    self.skipped.append((number, str(error) if isinstance(error, ValueError) else repr(error)))
                    continue
                yield number, start, record
        if self.skipped:
            number, reason = self.skipped[0]
            logger.warning("%s: skipped %d lines that are not %s (the first, line %d: %s)",
                           self.path, len(self.skipped), self.what, number, reason)


def read_jsonl(path: str | os.PathLike[str], parse: Callable[[Any], T] | None = None, what: str = "records"
               ) -> list[T]:
    """Every good record of ``path`` (`JsonlReader`, as a list)."""
    return list(JsonlReader(path, parse, what))


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Any], append: bool = False) -> int:
    """Write ``records`` one per line, atomically replacing ``path`` (or appending to it); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        lines = [dumps_line(record) for record in records]
        with path.open("ab") as handle:
            handle.write(b"".join(lines))  # one write: concurrent appenders never interleave within a line
        return len(lines)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        count = 0
        with os.fdopen(descriptor, "wb") as handle:
            for record in records:
                handle.write(dumps_line(record))
                count += 1
            handle.flush()
            os.fsync(handle.fileno())  # the data must be on disk before the rename makes it the file
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return count
