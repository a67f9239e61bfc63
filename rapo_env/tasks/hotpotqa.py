"""HotpotQA with its evidence: questions, supporting facts, and the context paragraphs as a corpus.

The distractor-setting files (HotpotQA's own JSON, and HippoRAG's/KAG's copies) list for
each question ten ``context`` paragraphs ``[title, [sentences]]`` and the
``supporting_facts`` ``[title, sentence_index]``. `load_hotpotqa` keeps them in each
task's metadata (``supporting_titles`` are the gold paragraphs, what retrieval should
find); `hotpotqa_passages` turns the union of the contexts into a searchable corpus, so
the questions can be played with no other corpus.

Example (needs the data folder)::

    tasks = load_hotpotqa("../shared/data/qa/hipporag_hotpotqa_train_100.json")
    tasks[0].metadata["supporting_titles"]     # ['Alû', 'Lilu (mythology)']
    passages = hotpotqa_passages("../shared/data/qa/hipporag_hotpotqa_train_100.json")
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rapo_env.tasks.base import Task, TaskList
from rapo_env.tasks.files import TaskFileError
from rapo_tools.jsonl import read_jsonl
from rapo_tools.search.corpus import Passage


def _read_records(path: str | os.PathLike) -> list[Mapping[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"HotpotQA file {path} does not exist")
    try:
        if path.suffix.lower() in (".jsonl", ".ndjson"):
            records = read_jsonl(path, what="HotpotQA records")
        else:
            records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TaskFileError(f"cannot read HotpotQA records from {path}: {error}") from error
    if not isinstance(records, list):
        raise TaskFileError(f"{path} must hold a list of HotpotQA records")
    return [record for record in records if isinstance(record, Mapping)]


def is_hotpotqa_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is a JSON/JSONL file whose first record has ``context`` and ``supporting_facts``."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in (".json", ".jsonl", ".ndjson"):
        return False
    try:
        records = _read_records(path)
    except TaskFileError:
        return False
    return bool(records) and "context" in records[0] and "supporting_facts" in records[0]


def _paragraphs(record: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    for item in record.get("context") or []:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            title, sentences = item
            text = "".join(sentences) if isinstance(sentences, list) else str(sentences)
            yield str(title), text.strip()


def load_hotpotqa(path: str | os.PathLike, name: str | None = None, limit: int | None = None) -> TaskList:
    """Read HotpotQA questions with their supporting facts.

    Each task's metadata holds ``supporting_facts`` (``[title, sentence index]`` pairs),
    ``supporting_titles`` (the gold paragraphs, in order of first mention),
    ``evidence_titles`` (the same; the name every QA task uses), ``type`` (bridge /
    comparison) and ``level``.

    Raises:
        TaskFileError: missing or unreadable file, or no record with a question and an answer.
    """
    path = Path(path)
    name = name or path.stem
    tasks = []
    for position, record in enumerate(_read_records(path)):
        question, answer = record.get("question"), record.get("answer")
        if not isinstance(question, str) or answer in (None, ""):
            continue
        facts = [list(fact) for fact in record.get("supporting_facts") or [] if isinstance(fact, (list, tuple))]
        titles = list(dict.fromkeys(str(fact[0]) for fact in facts if fact))
        identifier = record.get("_id", record.get("id", position))
        tasks.append(
            Task(
                id=f"{name}-{identifier}",
                question=question.strip(),
                answers=tuple(str(a) for a in answer) if isinstance(answer, list) else (str(answer),),
                source=name,
                metadata={
                    "supporting_facts": facts,
                    "supporting_titles": titles,
                    "evidence_titles": titles,
                    "search_queries": titles,
                    "type": record.get("type"),
                    "level": record.get("level"),
                },
            )
        )
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise TaskFileError(f"{path} holds no HotpotQA question with an answer")
    return TaskList(name, tasks)


def hotpotqa_passages(path: str | os.PathLike) -> list[Passage]:
    """The union of all context paragraphs of a HotpotQA file, one `Passage` per title (first seen wins)."""
    seen: dict[str, str] = {}
    for record in _read_records(path):
        for title, text in _paragraphs(record):
            seen.setdefault(title, text)
    if not seen:
        raise TaskFileError(f"{path} has no context paragraphs")
    return [Passage(str(row), title, text) for row, (title, text) in enumerate(seen.items())]
