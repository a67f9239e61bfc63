"""Off-policy trajectories from a scripted expert: the embedded default buffers' source.

One family of tasks each (``ScriptedSourceConfig.task``):

- ``math``: `rapo_agents.scripted.ExpertAgent` replays each procedural problem's gold solution program
  through the env's real python tool, writing ``<think>`` and ``<python>`` steps and a final ``<answer>``;
- ``qa``: `rapo_agents.scripted.SearchExpert` searches the entity of each hop of a knowledge-base question
  through the env's real ``<search>`` tool, then answers from the results.

The env scores each episode like any policy's. The experts are deterministic, so one rollout per question
suffices.

Example:
    >>> trajectories = list(scripted_expert_trajectories(ScriptedSourceConfig(num_tasks=2), show_progress=False))
    >>> [t.reward for t in trajectories], trajectories[0].source
    ([1.0, 1.0], 'expert')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

from tqdm.auto import tqdm

from rapo_agents.scripted import run_text_episode, scripted_expert
from rapo_env.core import ToolEnv
from rapo_env.trajectory import Trajectory

TASK_FAMILIES = ("math", "qa")


@dataclasses.dataclass(frozen=True)
class ScriptedSourceConfig:
    """Which questions the scripted expert solves (frozen: the default buffer's settings extend it and
    key a cache)."""

    task: Literal["math", "qa"] = "math"
    """Task family: ``math`` (procedural math, ``RAPO-Math-v0``) or ``qa`` (the generated multi-hop knowledge
    base, ``RAPO-QA-v0``)."""
    split: str = "train"
    """Split (``train``/``validation``/``test``); the trainer trains on ``train``."""
    num_tasks: int = 1000
    """Questions solved: the first ``num_tasks`` of the split, in the env's order."""
    difficulty: int | None = None
    """Math: operations per problem (1-5), or None for the mix `MathEnv` uses by default."""
    max_tool_calls: int = 3
    """Tool calls per episode (the reference's training limit)."""
    sandbox: str = "subprocess"
    """Math: the python sandbox backend that runs the expert's code."""
    knowledge_base: tuple[tuple[str, int], ...] = ()
    """QA: `KnowledgeBaseConfig` fields to change, as ``(name, value)`` pairs (a tuple, so the settings hash)."""
    search_topk: int = 3
    """QA: passages per ``<search>`` result (the training env's, so spliced results look like its own)."""
    hops: tuple[int, ...] | None = None
    """QA: only the questions of these hop counts (the training env's ``hops``); None: every count."""

    def __post_init__(self) -> None:
        if self.task not in TASK_FAMILIES:
            raise ValueError(f"task must be one of {TASK_FAMILIES}, got {self.task!r}")

    def make_env(self) -> ToolEnv:
        """The env the expert plays: the training env of its family, on these questions."""
        if self.task == "qa":
            from rapo_env.envs.qa import QAEnv

            return QAEnv(split=self.split, limit=self.num_tasks, knowledge_base=dict(self.knowledge_base),
                         hops=self.hops, search={"topk": self.search_topk}, max_tool_calls=self.max_tool_calls)
        from rapo_env.envs.math import MathEnv

        return MathEnv(split=self.split, num_tasks=self.num_tasks, difficulty=self.difficulty,
                       sandbox=self.sandbox, max_tool_calls=self.max_tool_calls)


def scripted_expert_trajectories(
    config: ScriptedSourceConfig | None = None, show_progress: bool = True
) -> Iterator[Trajectory]:
    """Play the family's expert once on each question of the split and yield the trajectories."""
    config = config or ScriptedSourceConfig()
    env = config.make_env()
    try:
        agent = scripted_expert(env.tasks, max_tool_calls=config.max_tool_calls)
        for task_index in tqdm(
            range(len(env.tasks)), desc=f"scripted {config.task} expert", unit="episode", disable=not show_progress
        ):
            yield run_text_episode(env, agent, task_index=task_index)
    finally:
        env.close()
