"""`resolve_reward`: the one way every rapo env turns its ``reward=`` argument into a reward function.

A reward is a name or any callable ``(response, task) -> Score``. The names mean the same in every env;
each env lists the ones that fit its tasks:

==================  =========================================================================================
name                reward
==================  =========================================================================================
``math_verify``     `MathVerifyReward`: answer equivalence (math), with rapo's format check
``f1``/``em``       `QAReward`: token F1 / exact match of the answer over the gold aliases
``substring``       `QAReward`: a gold alias occurs in the answer
``reference``       `QAReward` ``"reference"``: the reference's ``compute_score`` (spec §2), rapo's metrics beside
``judge``           `LLMJudgeReward`: an OpenAI-compatible judge model (needs ``judge=``)
==================  =========================================================================================

Example:
    >>> reward = resolve_reward("f1", ("search",), allowed=("f1", "em"), env_name="RAPO-QA-v0")
    >>> type(reward).__name__, reward.kind
    ('QAReward', 'f1')
    >>> resolve_reward("bleu", ("search",), allowed=("f1", "em"), env_name="RAPO-QA-v0")
    Traceback (most recent call last):
    ...
    ValueError: unknown RAPO-QA-v0 reward 'bleu'; use 'f1', 'em' or a callable (response, task) -> Score
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rapo_env.rewards import Score
from rapo_env.rewards.qa import QAReward
from rapo_env.tasks import Task

RewardSpec = str | Callable[[str, Task], Score]
"""What an env's ``reward=`` takes: a name (module docstring) or a callable ``(response, task) -> Score``."""

REWARD_NAMES = ("math_verify", "f1", "em", "substring", "reference", "judge")


def resolve_reward(
    reward: RewardSpec,
    tool_tags: Sequence[str],
    allowed: Sequence[str],
    env_name: str,
    format_penalty: float | None = None,
    judge: Any = None,
) -> Callable[[str, Task], Score]:
    """The reward function of ``reward`` for an env whose tools are ``tool_tags``.

    Args:
        reward: a name in ``allowed`` or a callable (passed through).
        tool_tags: the env's tool tags (the format checks and the multi-tool bonus look at them).
        allowed: the names this env offers.
        env_name: the env's id, for the error message.
        format_penalty: the reward of a badly formatted response for ``f1``/``em``/``substring`` (None: the
            metric alone).
        judge: the judge endpoint (`rapo_tools.web.chat.ChatConfig` or a dict) for ``judge``.

    Raises:
        ValueError: an unknown name, or ``judge`` without an endpoint.
    """
    if callable(reward):
        return reward
    if reward not in allowed:
        names = ", ".join(repr(name) for name in allowed)
        raise ValueError(f"unknown {env_name} reward {reward!r}; use {names} or a callable (response, task) -> Score")
    tags = tuple(tool_tags)
    if reward == "math_verify":
        from rapo_env.rewards.equivalence import MathVerifyReward

        return MathVerifyReward(tags)
    if reward == "judge":
        if judge is None:
            raise ValueError("reward='judge' needs judge={'base_url': ..., 'model': ...} (an OpenAI-compatible "
                             "endpoint)")
        from rapo_env.rewards.judge import LLMJudgeReward

        return LLMJudgeReward(judge, tags)
    return QAReward(reward, tags, format_penalty=None if reward == "reference" else format_penalty)
