"""Task sources: procedural generators, benchmark files, and Hugging Face datasets.

`resolve_tasks` turns an env's ``dataset`` argument into a task list.

Example:
    >>> from rapo_env.tasks import resolve_tasks
    >>> from rapo_env.tasks.procedural_math import ProceduralMath
    >>> tasks = resolve_tasks("procedural", "train", procedural=lambda split: ProceduralMath(num_tasks=4))
    >>> len(tasks)
    4
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rapo_env.tasks.base import Task, TaskList
from rapo_env.tasks.files import TaskFileError, load_tasks

HF_PREFIX = "hf:"


def resolve_tasks(
    dataset: str | Path | Sequence[Task],
    split: str,
    procedural: Callable[[str], TaskList],
    **file_options: Any,
) -> Sequence[Task]:
    """Resolve ``dataset``: ``"procedural"`` (the embedded default), a file path, ``"hf:<name>"``
    (a Hugging Face dataset, online only), or a ready sequence of tasks.

    Raises:
        TaskFileError: the name is none of these, or the file cannot be read.
    """
    if not isinstance(dataset, (str, Path)):
        return dataset
    name = str(dataset)
    if name == "procedural":
        return procedural(split)
    if name.startswith(HF_PREFIX):
        from rapo_env.tasks.hub import load_hub_tasks

        return load_hub_tasks(name[len(HF_PREFIX) :], split, **file_options)
    if Path(name).expanduser().is_file():
        return load_tasks(Path(name).expanduser(), **file_options)
    raise TaskFileError(
        f"dataset {name!r} is not 'procedural', an existing file (.jsonl/.json/.parquet) or 'hf:<name>'"
    )


__all__ = ["Task", "TaskFileError", "TaskList", "load_tasks", "resolve_tasks"]
