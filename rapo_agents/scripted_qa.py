"""`ScriptedQAAgent`: a text-level agent that plays QA episodes by searching each hop's evidence.

It looks up the task's evidence (``metadata["search_queries"]``: the entity of each hop
for the knowledge base, the supporting paragraphs for HotpotQA, else the question) through
the env's real ``<search>`` tool, and answers only from what the searches returned: a
later hop's query must have appeared in an earlier result, and the gold answer is given
only when the results contain it (or, for yes/no questions, when every evidence passage
was found). Otherwise it answers "unknown". So its reward measures the search stack:
a broken index, a dead service or a wrong observation format all lower it.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> from rapo_agents.scripted import run_text_episode
    >>> env = gym.make("RAPO-QA-v0", knowledge_base={"num_people": 10, "num_works": 6})
    >>> agent = ScriptedQAAgent(env.unwrapped.tasks)
    >>> trajectory = run_text_episode(env, agent, task_index=0)
    >>> trajectory.reward, trajectory.end_reason
    (1.0, 'answer')
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapo_env.rewards.text import normalize_answer
from rapo_env.tasks.base import Task

YES_NO = frozenset({"yes", "no"})
UNKNOWN = "unknown"


class ScriptedQAAgent:
    """Searches the evidence of each hop, then answers from the results.

    Args:
        tasks: The env's tasks (the agent reads their metadata, never ``info``'s).
        max_searches: Most ``<search>`` calls per episode (keep it within the env's ``max_tool_calls``).
    """

    name = "scripted_qa"

    def __init__(self, tasks: Sequence[Task], max_searches: int = 3):
        if max_searches < 1:
            raise ValueError("the scripted QA agent needs at least one search")
        self.max_searches = max_searches
        self._by_id = {task.id: task for task in tasks}
        self._task: Task | None = None
        self._queries: list[str] = []
        self._read = ""
        self._turn = 0

    def reset(self, prompt: str, info: dict[str, Any]) -> None:
        task = self._by_id.get(info["task_id"])
        if task is None:
            raise ValueError(f"task {info['task_id']!r} is not among the agent's tasks")
        self._task = task
        self._queries = list(task.metadata.get("search_queries") or [task.question])[: self.max_searches]
        self._read = ""
        self._turn = 0

    def act(self, observation: str) -> str:
        if self._task is None:
            raise RuntimeError("call reset() before act()")
        if self._turn:
            self._read += observation
        if self._turn < len(self._queries):
            query = self._queries[self._turn]
            if self._turn and query not in self._read:
                # The next hop's entity never showed up in a result: fall back to the question itself.
                query = self._task.question
            self._turn += 1
            return f"<think>I need to look up {query}.</think>\n<search>{query}</search>"
        answer = self._answer_from_results()
        return (
            "<think>The search results answer the question.</think>\n"
            f"<answer>The answer is \\boxed{{{answer}}}</answer>"
        )

    def _answer_from_results(self) -> str:
        read = normalize_answer(self._read)
        gold = self._task.answers[0] if self._task and self._task.answers else UNKNOWN
        if normalize_answer(gold) in YES_NO:
            titles = self._task.metadata.get("evidence_titles") or []
            return gold if titles and all(title in self._read for title in titles) else UNKNOWN
        return gold if normalize_answer(gold) and normalize_answer(gold) in read else UNKNOWN
