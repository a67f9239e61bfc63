"""The Step-Trace Buffer record and its JSONL file, compatible with the reference's ``Step_Trace_Buffer.jsonl``.

One line per step: ``key`` (the context before the step), ``value`` (the step's text with its
`` <result>...</result>``) and ``reward`` (the reward of the whole trajectory), plus optional
fields. Fields this schema does not know are kept in `StepTrace.extra` and written back.
The reference writer mixes other lines (lists of rewards) into the same file: reading skips
every line that is not a step record and counts it, it never raises on a bad line.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "buffer.jsonl"
    >>> step = StepTrace(key="Q: 2+3?", value="<python>2+3</python> <result>\\n5\\n</result>", reward=1.0)
    >>> write_buffer(path, [step])
    1
    >>> _ = path.open("a").write("[0.0, 1.0]\\n")
    >>> traces, stats = read_buffer(path)
    >>> traces[0].reward, stats.skipped
    (1.0, 1)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from typing import Any

from rapo_tools.jsonl import JsonlReader, write_jsonl

ANSWER_TAG = "<answer>"


def is_final_step_text(value: str) -> bool:
    """True when a step's text gives the final answer (it contains ``<answer>``)."""
    return ANSWER_TAG in value


@dataclasses.dataclass
class StepTrace:
    """One step of an off-policy trajectory, as the retriever stores it."""

    key: str
    """The context before the step: the question plus the history of earlier steps."""
    value: str
    """The step's text: the model's turn followed by the tool's `` <result>...</result>``."""
    reward: float
    """The reward of the trajectory the step comes from."""
    question_id: str | None = None
    """Id of the question (task) the trajectory answered."""
    step_index: int | None = None
    """Position of the step inside its trajectory, from 0."""
    is_final: bool | None = None
    """True for the step that writes ``<answer>``; None when unknown (then inferred from ``value``)."""
    answer: str | None = None
    """The trajectory's final answer text, when known."""
    source: str | None = None
    """Where the trajectory came from (``scripted_expert``, ``gsm8k_train``, a model name, ...)."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Fields of the JSONL line that this schema does not name (e.g. the reference's ``ground_truth``, ``f1``)."""

    @property
    def final(self) -> bool:
        """Whether the step gives the final answer, from ``is_final`` or, when unknown, from ``value``."""
        return self.is_final if self.is_final is not None else is_final_step_text(self.value)

    def to_dict(self) -> dict[str, Any]:
        """The JSONL object: extra fields first, named fields over them; unset optional fields are left out."""
        record: dict[str, Any] = dict(self.extra)
        record.update(key=self.key, value=self.value, reward=self.reward)
        for name in ("question_id", "step_index", "is_final", "answer", "source"):
            field_value = getattr(self, name)
            if field_value is not None:
                record[name] = field_value
        return record

    @classmethod
    def from_dict(cls, record: Any) -> StepTrace:
        """Parse one JSONL object.

        Raises:
            ValueError: when ``record`` is not a step record (not an object, or ``key``/``value``
                missing or not strings, or ``reward`` not a finite number).
        """
        if not isinstance(record, dict):
            raise ValueError(f"a step record is a JSON object, got {type(record).__name__}")
        key, value, reward = record.get("key"), record.get("value"), record.get("reward", 0.0)
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError("a step record needs string fields 'key' and 'value'")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"'reward' must be a finite number, got {reward!r}")
        step_index = record.get("step_index")
        is_final = record.get("is_final")
        known = {"key", "value", "reward", "question_id", "step_index", "is_final", "answer", "source"}
        return cls(
            key=key,
            value=value,
            reward=float(reward),
            question_id=None if record.get("question_id") is None else str(record["question_id"]),
            step_index=step_index if isinstance(step_index, int) and not isinstance(step_index, bool) else None,
            is_final=is_final if isinstance(is_final, bool) else None,
            answer=None if record.get("answer") is None else str(record["answer"]),
            source=None if record.get("source") is None else str(record["source"]),
            extra={name: field_value for name, field_value in record.items() if name not in known},
        )


@dataclasses.dataclass
class BufferReadStats:
    """What `read_buffer` saw."""

    lines: int = 0
    """Non-empty lines read."""
    records: int = 0
    """Lines parsed as step records."""
    skipped: int = 0
    """Lines that were not step records (bad JSON, reward lists, missing fields)."""


def read_buffer(path: str | os.PathLike[str]) -> tuple[list[StepTrace], BufferReadStats]:
    """Read a buffer JSONL file, skipping (and counting) lines that are not step records.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
    """
    reader = JsonlReader(path, StepTrace.from_dict, what="step records")
    traces = list(reader)
    return traces, BufferReadStats(lines=reader.lines, records=len(traces), skipped=len(reader.skipped))


def write_buffer(path: str | os.PathLike[str], traces: Iterable[StepTrace]) -> int:
    """Write ``traces`` as JSONL (atomically: a temporary file renamed into place). Returns the count."""
    return write_jsonl(path, (trace.to_dict() for trace in traces))
