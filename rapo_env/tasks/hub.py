"""Tasks from Hugging Face datasets by name (needs the ``datasets`` package and a network).

Example (online only)::

    tasks = load_hub_tasks("openai/gsm8k", "test", config="main")
"""

from __future__ import annotations

from typing import Any

from rapo_env.tasks.base import TaskList
from rapo_env.tasks.files import TaskFileError, task_from_record


def load_hub_tasks(name: str, split: str, config: str | None = None, limit: int | None = None,
                   **_: Any) -> TaskList:
    """Download ``name`` (optionally its ``config``) and read ``split`` with the file loader's field rules.

    Raises:
        TaskFileError: ``datasets`` is missing, the download fails, or no row has a question and answer.
    """
    try:
        import datasets
    except ImportError as error:
        raise TaskFileError("loading 'hf:' datasets needs `pip install rapo[hf]`") from error
    try:
        rows = datasets.load_dataset(name, config, split=split)
    except Exception as error:  # offline machines, unknown names, gated sets
        raise TaskFileError(f"cannot load Hugging Face dataset {name!r} ({split}): {error}") from error
    source = name.split("/")[-1]
    tasks = []
    for position, row in enumerate(rows):
        task = task_from_record(row, source, position)
        if task is not None:
            tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise TaskFileError(f"Hugging Face dataset {name!r} ({split}) has no row with a question and an answer")
    return TaskList(source, tasks)
