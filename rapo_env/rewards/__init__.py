"""Outcome rewards. A reward is a callable ``(response, task) -> Score``.

``response`` is the whole episode transcript: the policy's turns and the tool results
that followed them (never a spliced retrieval, which the env does not see).

Example:
    >>> from rapo_env.rewards import Score
    >>> Score(reward=1.0, metrics={"accuracy": 1.0}).reward
    1.0
    >>> Score(-1.0, {"format_ok": 0.0}, format_error="no <think>...</think>").format_error
    'no <think>...</think>'
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
    format_error: str | None = None
    """What was wrong with the format when the reward is a format penalty (the final step's
    ``info["format_error"]``); None for a well-formed response."""


class Reward(Protocol):
    """Scores a finished episode."""

    def __call__(self, response: str, task: Task) -> Score: ...


__all__ = ["Reward", "Score"]
