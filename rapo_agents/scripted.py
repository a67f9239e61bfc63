"""Text-level scripted experts and the loop that plays one episode with them.

Two experts, one per embedded task family; each writes only what it read from a real tool result:

- `ExpertAgent` solves procedural math problems from their gold solution programs, through the env's
  python tool: it never writes a number it has not read from a result.
- `SearchExpert` answers multi-hop knowledge questions with one ``<search>`` per hop: the entity the chain
  needs next, read from the previous result, then the answer found in the last one.

`scripted_expert` picks the one that plays a task list. They drive the warm-up and fill the default
step-trace buffers (`rapo_agents.buffer_build.defaults`).

Example:
    >>> import gymnasium as gym, rapo_env
    >>> env = gym.make("RAPO-Math-v0", num_tasks=3, sandbox="subprocess")
    >>> agent = scripted_expert(env.unwrapped.tasks)
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
from rapo_env.rewards.text import normalize_answer
from rapo_env.tasks.base import Task
from rapo_env.tasks.knowledge_base import relation_phrase
from rapo_env.trajectory import StepRecord, Trajectory
from rapo_env.wrappers.retrieval import split_spliced_text


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


class SearchExpert:
    """Answers a multi-hop question with one ``<search>`` per hop, then the answer it read.

    It searches the entity of each hop (``metadata["search_queries"]``: for the knowledge base, the names
    along the relation chain; for HotpotQA, the supporting paragraphs' titles). A later hop's entity is
    searched only once an earlier result named it (else the question itself is searched), and the gold answer
    is written only when the results contain it (yes/no answers: when every evidence passage was found);
    otherwise it answers ``unknown``. So its reward measures the search stack, and every step it writes, the
    retrieved step a hybrid rollout is shown, names the query the chain needs next.

    Args:
        tasks: The env's tasks (the expert reads their metadata, never ``info``'s).
        max_tool_calls: Most searches per episode (a chain longer than this is answered ``unknown``).

    Example:
        >>> import gymnasium as gym, rapo_env
        >>> env = gym.make("RAPO-QA-v0", knowledge_base={"num_people": 10, "num_works": 6})
        >>> task_index = next(i for i, t in enumerate(env.unwrapped.tasks) if t.metadata["hops"] == 2)
        >>> trajectory = run_text_episode(env, SearchExpert(env.unwrapped.tasks), task_index=task_index)
        >>> trajectory.reward, trajectory.num_tool_calls
        (1.0, 2)
        >>> env.close()
    """

    name = "search_expert"

    def __init__(self, tasks: Sequence[Task], max_tool_calls: int = 3):
        if max_tool_calls < 1:
            raise ValueError("the search expert needs at least one search")
        self.max_tool_calls = max_tool_calls
        self._by_id = {task.id: task for task in tasks}
        self._task: Task | None = None
        self._queries: list[str] = []
        self._read = ""
        self._turn = 0

    def reset(self, prompt: str, info: dict[str, Any]) -> None:
        task = self._by_id.get(info["task_id"])
        if task is None:
            raise ValueError(f"task {info['task_id']!r} is not among the expert's tasks")
        self._task = task
        self._queries = list(task.metadata.get("search_queries") or [task.question])
        self._read = ""
        self._turn = 0

    def act(self, observation: str) -> str:
        if self._task is None:
            raise RuntimeError("call reset() before act()")
        if self._turn:
            self._read += observation
        if self._turn < min(len(self._queries), self.max_tool_calls):
            query = self._queries[self._turn]
            thought = f"I need to look up {query}."
            if self._turn and query not in self._read:
                # The next hop's entity never showed up in a result: fall back to the question itself.
                query, thought = self._task.question, "I search the question itself."
            elif self._turn and self._turn <= len(self._task.metadata.get("relations", ())):
                found = relation_phrase(self._task.metadata["relations"][self._turn - 1], self._queries[self._turn - 1])
                thought = f"{found[0].upper()}{found[1:]} is {query}. Next I look up {query}."
            self._turn += 1
            return f"<think>{thought}</think>\n<search>{query}</search>"
        answer = self._answer_from_results()
        return (f"<think>The search results give the answer: {answer}.</think>\n"
                f"<answer>The answer is \\boxed{{{answer}}}</answer>")

    def _answer_from_results(self) -> str:
        task, read = self._task, normalize_answer(self._read)
        gold = task.answers[0] if task.answers else "unknown"
        if len(self._queries) > self.max_tool_calls:
            return "unknown"
        if normalize_answer(gold) in ("yes", "no"):
            titles = task.metadata.get("evidence_titles") or []
            return gold if titles and all(title in self._read for title in titles) else "unknown"
        return gold if normalize_answer(gold) and normalize_answer(gold) in read else "unknown"


def scripted_expert(tasks: Sequence[Task], max_tool_calls: int = 3) -> ExpertAgent | SearchExpert:
    """The scripted expert that plays ``tasks``: `ExpertAgent` for procedural math (tasks with a solution
    program), `SearchExpert` for questions with search evidence (the knowledge base, HotpotQA).

    Raises:
        ValueError: when the tasks carry neither (no expert can play them; turn the warm-up off or bring a buffer).
    """
    first = tasks[0] if len(tasks) else None
    if first is not None and "steps" in first.metadata:
        return ExpertAgent(tasks, max_tool_calls=max_tool_calls)
    if first is not None and "search_queries" in first.metadata:
        return SearchExpert(tasks, max_tool_calls=max_tool_calls)
    raise ValueError("no scripted expert plays these tasks: the embedded experts play procedural math and "
                     "knowledge-base questions; set warmup.sft_steps=0 and give a buffer as retrieval.retriever")



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
