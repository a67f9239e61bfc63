"""Text-level scripted agents and the loop that plays one episode with them.

`ExpertAgent` solves procedural math problems from their gold solution programs, through
the env's real python tool: it never writes a number it has not read from a tool result.
It drives the `make run` demo and fills the default step-trace buffer.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> env = gym.make("RAPO-Math-v0", num_tasks=3, sandbox="subprocess")
    >>> agent = ExpertAgent(env.unwrapped.tasks)
    >>> trajectory = run_text_episode(env, agent, task_index=1)
    >>> trajectory.reward, trajectory.end_reason
    (1.0, 'answer')
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import gymnasium as gym

from rapo_env.protocol import RESULT_CLOSE, RESULT_OPEN
from rapo_env.tasks.base import Task
from rapo_env.trajectory import StepRecord, Trajectory


class TextAgent(Protocol):
    """An agent that reads and writes text turns."""

    name: str

    def reset(self, prompt: str, info: dict[str, Any]) -> None:
        """Start an episode."""

    def act(self, observation: str) -> str:
        """Write the next turn, given the last observation (the prompt on the first turn)."""


def last_result_line(observation: str) -> str:
    """The last non-empty line inside the observation's ``<result>`` block."""
    start, end = observation.rfind(RESULT_OPEN), observation.rfind(RESULT_CLOSE)
    body = observation[start + len(RESULT_OPEN) : end] if start != -1 and end > start else observation
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ExpertAgent:
    """Replays a task's ``solution_program`` in at most ``max_tool_calls`` python calls, then answers.

    Each call restates the running value read from the previous result, since every python call
    runs in a fresh interpreter.

    Raises:
        ValueError: on reset, when the task has no ``solution_program`` (only procedural math has one).
    """

    name = "expert"

    def __init__(self, tasks: Sequence[Task], max_tool_calls: int = 3):
        if max_tool_calls < 1:
            raise ValueError("the expert needs at least one tool call")
        self.tasks, self.max_tool_calls = tasks, max_tool_calls
        self._by_id = {task.id: task for task in tasks}
        self._chunks: list[list[tuple[str, str]]] = []
        self._variable = ""
        self._turn = 0

    def reset(self, prompt: str, info: dict[str, Any]) -> None:
        task = self._by_id.get(info["task_id"])
        if task is None or "steps" not in task.metadata:
            raise ValueError(f"task {info['task_id']!r} has no solution program; ExpertAgent plays procedural math")
        steps = list(task.metadata["steps"])
        calls = min(self.max_tool_calls, len(steps))
        size = -(-len(steps) // calls)
        self._chunks = [steps[i : i + size] for i in range(0, len(steps), size)]
        self._variable = task.metadata["variable"]
        self._turn = 0

    def act(self, observation: str) -> str:
        previous = last_result_line(observation) if self._turn else ""
        if self._turn == len(self._chunks):
            return (f"<think>The program printed {previous}, which answers the question.</think>\n"
                    f"<answer>The answer is \\boxed{{{previous}}}</answer>")
        chunk = self._chunks[self._turn]
        restate = f"{self._variable} = {previous}\n" if self._turn else ""
        code = restate + "\n".join(line for _, line in chunk) + f"\nprint({self._variable})"
        thought = " ".join(explanation for explanation, _ in chunk)
        self._turn += 1
        return f"<think>{thought} Let me compute it.</think>\n<python>\n{code}\n</python>"


def split_spliced_text(observation: str, info: dict[str, Any]) -> str:
    """The env's own part of an observation: without the text a retrieval wrapper spliced in."""
    retrieval = info.get("retrieval")
    if not retrieval:
        return observation
    start, end = retrieval["span"]
    return observation[:start] + observation[end:]


def run_text_episode(
    env: gym.Env,
    agent: TextAgent,
    task_index: int | None = None,
    rollout_index: int = 0,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode of ``agent`` in ``env`` and record it as a `Trajectory`."""
    options: dict[str, Any] = {"rollout_index": rollout_index}
    if task_index is not None:
        options["task_index"] = task_index
    prompt, info = env.reset(seed=seed, options=options)
    agent.reset(prompt, info)
    steps: list[StepRecord] = []
    observation, done, reward, step_info = prompt, False, 0.0, info
    while not done:
        action = agent.act(observation)
        observation, reward, terminated, truncated, step_info = env.step(action)
        done = terminated or truncated
        steps.append(StepRecord(
            action=action,
            observation=split_spliced_text(observation, step_info),
            tool=step_info.get("tool"),
            tool_ok=step_info.get("tool_ok"),
            retrieval=step_info.get("retrieval"),
        ))
    question = env.unwrapped.task.question if hasattr(env.unwrapped, "task") else prompt
    return Trajectory(
        task_id=info["task_id"], rollout_index=rollout_index, question=question,
        system_prompt=info.get("system_prompt", ""), prompt=prompt, steps=steps, reward=float(reward),
        metrics=step_info.get("metrics", {}), num_tool_calls=step_info.get("tool_calls", 0),
        end_reason=step_info.get("episode_end", "unknown"), source=agent.name,
    )
