"""Outcome rewards. A reward is a callable ``(response, task) -> Score``.

``response`` is the whole episode transcript: the policy's turns and the tool results
that followed them (never a spliced retrieval, which the env does not see).

Example:
    >>> from rapo_env.rewards import Score
    >>> Score(reward=1.0, metrics={"accuracy": 1.0}).reward
    1.0
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from rapo_env.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class Score:
    """A reward with the metrics behind it (reported in the final step's ``info["metrics"]``)."""

    reward: float
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class Reward(Protocol):
    """Scores a finished episode."""

    def __call__(self, response: str, task: Task) -> Score: ...


__all__ = ["Reward", "Score"]
