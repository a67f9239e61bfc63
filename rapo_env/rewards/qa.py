"""Rewards of the knowledge tasks: exact match, token F1, substring match, and the reference reward.

Every kind scores the policy's final answer (the ``\\boxed{}`` of its ``<answer>``, or the
bare answer text) against each gold alias and keeps the best score. All kinds report the
same metrics (``em``, ``f1``, ``substring``, ``format_ok``), so runs with different rewards
stay comparable; only ``reward`` differs:

- ``"f1"``, ``"em"``, ``"substring"``: that metric (0 without an answer);
- ``"reference"``: the reference's ``compute_score`` (spec §2: -1 for bad format, else F1, +0.1
  when both ``<search>`` and ``<python>`` were used), with its own stricter format check.

A format penalty comes with ``Score.format_error``, which says what was wrong.

Example:
    >>> from rapo_env.tasks.base import Task
    >>> task = Task(id="q", question="Capital of France?", answers=("Paris", "City of Paris"), source="toy")
    >>> score = QAReward("f1")("<answer>\\\\boxed{the city of Paris}</answer>", task)
    >>> score.reward, score.metrics["em"]
    (1.0, 1.0)
    >>> score = QAReward("reference")("<think>easy</think><answer>Paris</answer>", task)  # no \\boxed{}
    >>> score.reward, score.format_error
    (-1.0, 'the answer has no \\\\boxed{...} (with braces)')
"""

from __future__ import annotations

from collections.abc import Iterable

from rapo_env.protocol import TOOL_TAGS, check_format
from rapo_env.rewards import Score
from rapo_env.rewards.text import (
    best_over_aliases,
    exact_match,
    final_answer,
    reference_reward,
    substring_match,
    token_f1,
)
from rapo_env.tasks.base import Task

QA_REWARD_KINDS = ("f1", "em", "substring", "reference")


class QAReward:
    """Scores a QA transcript against the task's gold aliases.

    Args:
        kind: One of `QA_REWARD_KINDS`.
        tool_tags: The env's tool tags (the format check and the multi-tool bonus look at them).
        format_penalty: The reward of a badly formatted response for ``em``/``f1``/``substring``
            (None: no penalty, the metric alone; the web env uses the reference's -1).

    Raises:
        ValueError: an unknown ``kind``.
    """

    def __init__(self, kind: str = "f1", tool_tags: Iterable[str] = TOOL_TAGS, format_penalty: float | None = None):
        if kind not in QA_REWARD_KINDS:
            raise ValueError(f"unknown QA reward {kind!r}; use one of {QA_REWARD_KINDS}")
        self.kind = kind
        self.tool_tags = tuple(tool_tags)
        self.format_penalty = format_penalty

    def __call__(self, response: str, task: Task) -> Score:
        prediction = final_answer(response)
        check = check_format(response, self.tool_tags)
        metrics = {
            "em": best_over_aliases(exact_match, prediction, task.answers) if prediction else 0.0,
            "f1": best_over_aliases(token_f1, prediction, task.answers) if prediction else 0.0,
            "substring": best_over_aliases(substring_match, prediction, task.answers) if prediction else 0.0,
            "format_ok": float(check.ok),
            "answered": float(prediction is not None),
        }
        if self.kind == "reference":
            # The reference's own format check decides here, so format_ok and format_error follow it.
            score = reference_reward(response, task, self.tool_tags)
            return Score(score.reward, metrics | {"format_ok": score.metrics["format_ok"]}, score.format_error)
        if self.format_penalty is not None and not check.ok:
            return Score(float(self.format_penalty), metrics, check.reason)
        return Score(float(metrics[self.kind]), metrics)
