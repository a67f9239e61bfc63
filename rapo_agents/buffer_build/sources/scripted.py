"""Off-policy trajectories from the scripted expert on procedural math: the embedded default buffer's source.

`rapo_agents.scripted.ExpertAgent` replays each problem's gold solution program through the
env's real python tool, writing ``<think>`` and ``<python>`` steps and a final ``<answer>``; the
env scores it like any policy. The expert is deterministic, so one rollout per question suffices.

Example:
    >>> trajectories = list(scripted_expert_trajectories(ScriptedSourceConfig(num_tasks=2), show_progress=False))
    >>> [t.reward for t in trajectories], trajectories[0].source
    ([1.0, 1.0], 'expert')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tqdm.auto import tqdm

from rapo_agents.scripted import ExpertAgent, run_text_episode
from rapo_env.envs.math import MathEnv
from rapo_env.trajectory import Trajectory


@dataclasses.dataclass(frozen=True)
class ScriptedSourceConfig:
    """Which procedural problems the scripted expert solves (frozen: the default buffer's settings extend it and
    key a cache)."""

    split: str = "train"
    """Procedural split (``train``/``validation``/``test``); the trainer trains on ``train``."""
    num_tasks: int = 1000
    """Problems solved (the first ``num_tasks`` of the split, as `MathEnv` generates them)."""
    difficulty: int | None = None
    """Operations per problem (1-5), or None for the mix `MathEnv` uses by default."""
    max_tool_calls: int = 3
    """Tool calls per episode (the reference's training limit)."""
    sandbox: str = "subprocess"
    """Python sandbox backend that runs the expert's code."""


def scripted_expert_trajectories(
    config: ScriptedSourceConfig | None = None, show_progress: bool = True
) -> Iterator[Trajectory]:
    """Play the expert once on each problem of the split and yield the trajectories."""
    config = config or ScriptedSourceConfig()
    env = MathEnv(
        split=config.split,
        num_tasks=config.num_tasks,
        difficulty=config.difficulty,
        sandbox=config.sandbox,
        max_tool_calls=config.max_tool_calls,
    )
    try:
        agent = ExpertAgent(env.tasks, max_tool_calls=config.max_tool_calls)
        for task_index in tqdm(
            range(len(env.tasks)), desc="scripted expert", unit="episode", disable=not show_progress
        ):
            yield run_text_episode(env, agent, task_index=task_index)
    finally:
        env.close()
