"""What a task source yields: `Task` rows, gathered in a `TaskList`.

Example:
    >>> tasks = TaskList("toy", [Task(id="toy-0", question="1+1?", answers=("2",), source="toy")])
    >>> len(tasks), tasks[0].answers
    (1, ('2',))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, overload


@dataclasses.dataclass(frozen=True)
class Task:
    """One question of a dataset."""

    id: str
    """Stable identifier, unique within its source."""
    question: str
    """The question text shown to the model."""
    answers: tuple[str, ...]
    """Gold answers; any of them counts as correct (aliases)."""
    source: str
    """Name of the dataset the task comes from."""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    """Extra fields of the source (solution programs, supporting facts, difficulty, ...)."""


class TaskList(Sequence[Task]):
    """An indexable, named collection of tasks with lookup by id."""

    def __init__(self, name: str, tasks: Iterable[Task]):
        self.name = name
        self._tasks = list(tasks)
        self._index_by_id = {task.id: index for index, task in enumerate(self._tasks)}

    @overload
    def __getitem__(self, index: int) -> Task: ...
    @overload
    def __getitem__(self, index: slice) -> TaskList: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return TaskList(self.name, self._tasks[index])
        return self._tasks[index]

    def __len__(self) -> int:
        return len(self._tasks)

    def index_of(self, task_id: str) -> int:
        """Position of the task with id ``task_id``.

        Raises:
            KeyError: no task has that id.
        """
        try:
            return self._index_by_id[task_id]
        except KeyError:
            raise KeyError(f"no task with id {task_id!r} in {self.name!r}") from None

    def __repr__(self) -> str:
        return f"TaskList({self.name!r}, {len(self)} tasks)"
