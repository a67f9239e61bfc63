"""Text-answer metrics (SQuAD normalisation, token F1, EM, substring) and the reference reward of spec §2.

Example:
    >>> token_f1("The Eiffel tower", "eiffel tower")
    1.0
    >>> round(token_f1("Paris, France", "Paris"), 3)
    0.667
    >>> from rapo_env.tasks.base import Task
    >>> task = Task(id="t", question="?", answers=("Paris",), source="toy")
    >>> reference_reward("<answer>\\\\boxed{Paris}</answer>", task).reward
    1.0
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable

from rapo_env.protocol import TOOL_TAGS, check_format, extract_answer, extract_boxed, strip_results
from rapo_env.rewards import Score
from rapo_env.tasks.base import Task

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
MULTI_TOOL_BONUS = 0.1
FORMAT_PENALTY = -1.0


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings (SQuAD)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def substring_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised gold answer occurs in the normalised prediction."""
    expected = normalize_answer(gold)
    return float(bool(expected) and expected in normalize_answer(prediction))


def best_over_aliases(metric: Callable[[str, str], float], prediction: str, golds: Iterable[str]) -> float:
    """The best score of ``prediction`` against any gold alias (0.0 without aliases)."""
    return max((metric(prediction, gold) for gold in golds), default=0.0)


def final_answer(response: str) -> str | None:
    """The policy's final answer: the ``\\boxed{}`` of its ``<answer>``, or the bare answer text."""
    answer = extract_answer(strip_results(response))
    if answer is None:
        return None
    boxed = extract_boxed(answer)
    return boxed if boxed is not None else answer.strip()


def used_tools(response: str, tool_tags: Iterable[str] = TOOL_TAGS) -> set[str]:
    """The tool tags the policy called in ``response``."""
    own = strip_results(response)
    return {tag for tag in tool_tags if f"</{tag}>" in own}


def reference_reward(response: str, task: Task, tool_tags: Iterable[str] = TOOL_TAGS) -> Score:
    """Spec §2, as the reference computes it for math and QA.

    -1 for bad format; else the best token F1 of the boxed answer over the gold aliases,
    plus 0.1 when the episode used both ``<search>`` and ``<python>`` and F1 > 0.
    """
    tool_tags = tuple(tool_tags)
    check = check_format(response, tool_tags)
    if not check.ok:
        return Score(FORMAT_PENALTY, {"format_ok": 0.0, "f1": 0.0, "em": 0.0})
    prediction = final_answer(response) or ""
    f1 = best_over_aliases(token_f1, prediction, task.answers)
    em = best_over_aliases(exact_match, prediction, task.answers)
    bonus = MULTI_TOOL_BONUS if f1 > 0 and {"search", "python"} <= used_tools(response, tool_tags) else 0.0
    return Score(f1 + bonus, {"format_ok": 1.0, "f1": f1, "em": em})
