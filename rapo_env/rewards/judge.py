"""LLM-as-judge reward: an OpenAI-compatible chat model decides whether the predicted answer is
equivalent to the gold answer, as the reference's web-agent evaluation does.

Token F1 under-rewards correct free-form answers ("Sept. 1, 2022" vs "September 1, 2022");
a judge does not. The judge sees the question, the gold answer(s) and the policy's final
answer, and replies ``Correct`` or ``Incorrect``. When the judge endpoint fails, the
reward falls back to token F1 and says so in the metrics (``judge_error``), so that a
dead judge never crashes an episode.

Example (with a served model)::

    reward = LLMJudgeReward({"base_url": "http://127.0.0.1:8000/v1", "model": "qwen2.5-72b-instruct"})
    score = reward("<answer>\\\\boxed{Paris}</answer>", task)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from rapo_env.protocol import TOOL_TAGS, check_format
from rapo_env.rewards import Score
from rapo_env.rewards.text import FORMAT_PENALTY, best_over_aliases, exact_match, final_answer, token_f1
from rapo_env.tasks.base import Task
from rapo_tools.aio import run_sync
from rapo_tools.base import ToolError
from rapo_tools.web.chat import ChatClient, ChatConfig

logger = logging.getLogger(__name__)

JUDGE_PROMPT = (
    "Determine whether the predicted answer is equivalent to the labeled answer for the question below. "
    "They need not match word for word: the same entity, number, date or fact in another wording, unit "
    "or format is equivalent; a different or only partly correct answer is not.\n\n"
    "Question: {question}\n"
    "Labeled answer: {gold}\n"
    "Predicted answer: {prediction}\n\n"
    "Are these two answers equivalent? Reply with exactly one word: Correct or Incorrect."
)
_VERDICT = re.compile(r"\b(incorrect|correct)\b", re.IGNORECASE)


def parse_verdict(reply: str) -> bool | None:
    """True for ``Correct``, False for ``Incorrect``, None when the reply says neither."""
    match = _VERDICT.search(reply)
    return None if match is None else match.group(1).lower() == "correct"


class LLMJudgeReward:
    """Reward 1.0 when the judge finds the final answer equivalent to a gold answer, else 0.0.

    A transcript with bad format gets the reference's format penalty (-1) without asking the judge.

    Args:
        chat: The judge's OpenAI-compatible endpoint (a `ChatConfig` or a dict of its fields).
        tool_tags: The env's tool tags, for the format check.
    """

    def __init__(self, chat: ChatConfig | dict[str, Any], tool_tags: Iterable[str] = TOOL_TAGS):
        self.client = ChatClient(chat)
        self.tool_tags = tuple(tool_tags)

    def judge(self, question: str, golds: Iterable[str], prediction: str) -> bool | None:
        """Ask the judge; None when it cannot be reached or gives no verdict."""
        prompt = JUDGE_PROMPT.format(question=question, gold=" OR ".join(golds), prediction=prediction)
        try:
            reply = run_sync(self.client.complete([{"role": "user", "content": prompt}], max_tokens=16))
        except ToolError as error:
            logger.warning("the judge failed (%s); falling back to token F1", error)
            return None
        return parse_verdict(reply)

    def __call__(self, response: str, task: Task) -> Score:
        check = check_format(response, self.tool_tags)
        if not check.ok:
            return Score(FORMAT_PENALTY, {"format_ok": 0.0, "judge": 0.0, "f1": 0.0, "em": 0.0}, check.reason)
        prediction = final_answer(response) or ""
        f1 = best_over_aliases(token_f1, prediction, task.answers)
        em = best_over_aliases(exact_match, prediction, task.answers)
        verdict = self.judge(task.question, task.answers, prediction) if prediction else False
        metrics = {"format_ok": 1.0, "f1": f1, "em": em, "judge_error": float(verdict is None)}
        if verdict is None:
            return Score(f1, metrics | {"judge": 0.0})
        return Score(float(verdict), metrics | {"judge": float(verdict)})

    def close(self) -> None:
        run_sync(self.client.aclose())
