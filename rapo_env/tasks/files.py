"""Load tasks from JSONL, JSON and parquet files in the formats of the reference benchmarks.

Understood layouts (see ``../shared/data``): GSM8K (``answer`` ending in ``#### x``),
MATH500 / AIME (``problem`` + ``answer``), ARPO evaluation files (``question`` + list of
aliases), GAIA (``Question``), FlashRAG / Search-R1 (``golden_answers``), DeepResearcher
(aliases joined by ``<|answer_split|>``) and verl RL parquet files (a chat ``prompt``
column, ``reward_model.ground_truth`` and ``extra_info``).

Example:
    >>> import json, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "toy.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write(json.dumps({"question": "2+2?", "answer": "It is 4.\\n#### 4"}) + "\\n")
    >>> load_tasks(path)[0].answers
    ('4',)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rapo_env.tasks.base import Task, TaskList
from rapo_tools.jsonl import JsonlReader

logger = logging.getLogger(__name__)

QUESTION_FIELDS = ("question", "problem", "Question", "query")
ANSWER_FIELDS = ("answers", "golden_answers", "answer", "final_answer", "gold")
ID_FIELDS = ("id", "task_id", "unique_id", "_id", "idx")
ALIAS_SEPARATOR = "<|answer_split|>"


class TaskFileError(ValueError):
    """A task file is missing, empty or in no known layout."""


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _answers_from(value: Any) -> tuple[str, ...]:
    """Normalise a gold-answer field: string, number, list, GSM8K solution, alias-joined string or dict."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return _answers_from(value.get("target", value.get("ground_truth")))
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        items = value.tolist() if hasattr(value, "tolist") else value
        return tuple(answer for item in items for answer in _answers_from(item))
    text = str(value).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    if ALIAS_SEPARATOR in text:
        return tuple(part.strip() for part in text.split(ALIAS_SEPARATOR) if part.strip())
    return (text,) if text else ()


def _chat_messages(prompt: Any) -> list[Mapping[str, Any]]:
    items = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    return [message for message in items or [] if isinstance(message, Mapping)]


def task_from_record(record: Mapping[str, Any], source: str, position: int) -> Task | None:
    """Build a `Task` from one record of any known layout; None when it has no question or answer."""
    extra = _as_mapping(record.get("extra_info"))
    messages = _chat_messages(record.get("prompt")) if isinstance(record.get("prompt"), (list, tuple)) or hasattr(
        record.get("prompt"), "tolist"
    ) else []
    question = next((record[key] for key in QUESTION_FIELDS if isinstance(record.get(key), str)), None)
    question = question or extra.get("question")
    if question is None and messages:
        user_turns = [m.get("content", "") for m in messages if m.get("role") == "user"]
        question = user_turns[-1] if user_turns else None
    answers = next((_answers_from(record[key]) for key in ANSWER_FIELDS if record.get(key) is not None), ())
    if not answers:
        answers = _answers_from(_as_mapping(record.get("reward_model")).get("ground_truth"))
    if not question or not answers:
        return None
    identifier = next((record[key] for key in ID_FIELDS if record.get(key) not in (None, "")), None)
    if identifier is None:
        identifier = extra.get("index", position)
    metadata = {key: value for key, value in record.items() if key not in QUESTION_FIELDS + ANSWER_FIELDS}
    system_turns = [m.get("content", "") for m in messages if m.get("role") == "system"]
    if system_turns:
        metadata["system_prompt"] = system_turns[0]
    return Task(id=f"{source}-{identifier}", question=str(question).strip(), answers=answers, source=source,
                metadata=metadata)


def _records(path: Path) -> Iterator[Mapping[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    elif suffix in (".jsonl", ".ndjson"):
        yield from JsonlReader(path, what="JSON records")
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, Mapping):
            data = next((value for value in data.values() if isinstance(value, list)), [data])
        yield from data
    else:
        raise TaskFileError(f"{path}: unknown task file type {suffix!r}; use .jsonl, .json or .parquet")


def load_tasks(
    path: str | Path,
    name: str | None = None,
    ability: str | None = None,
    limit: int | None = None,
) -> TaskList:
    """Read every task of a JSONL, JSON or parquet file.

    Args:
        path: The file.
        name: Dataset name (default: the file stem); task ids are ``"{name}-{id}"``.
        ability: Keep only records whose ``ability`` field equals this (the verl RL files mix
            ``math`` and ``qa``).
        limit: Keep at most this many tasks.

    Raises:
        TaskFileError: the file is missing, unreadable, or yields no task.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"task file {path} does not exist")
    name = name or path.stem
    tasks: list[Task] = []
    skipped = 0
    try:
        records: Iterable[Mapping[str, Any]] = _records(path)
        for position, record in enumerate(records):
            if not isinstance(record, Mapping) or (ability is not None and record.get("ability") != ability):
                skipped += not isinstance(record, Mapping)
                continue
            task = task_from_record(record, name, position)
            if task is None:
                skipped += 1
                continue
            tasks.append(task)
            if limit is not None and len(tasks) >= limit:
                break
    except (OSError, ValueError) as error:
        raise TaskFileError(f"cannot read tasks from {path}: {error}") from error
    if skipped:
        logger.warning("%s: skipped %d records without a question or an answer", path, skipped)
    if not tasks:
        raise TaskFileError(f"{path} holds no task with a question and an answer")
    return TaskList(name, tasks)
