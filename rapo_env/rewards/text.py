"""Text-answer metrics (SQuAD normalisation, token F1, EM, substring) and the reference reward of spec §2.

Example:
    >>> token_f1("The Eiffel tower", "eiffel tower")
    1.0
    >>> round(token_f1("Paris, France", "Paris"), 3)
    0.667
    >>> from rapo_env.tasks.base import Task
    >>> task = Task(id="t", question="?", answers=("Paris",), source="toy")
    >>> reference_reward("<think>easy</think><answer>\\\\boxed{Paris}</answer>", task).reward
    1.0
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable

from rapo_env.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_TAGS,
    FormatCheck,
    closing_brace,
    extract_answer,
    extract_boxed,
    strip_results,
)
from rapo_env.rewards import Score
from rapo_env.tasks.base import Task

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
MULTI_TOOL_BONUS = 0.1
FORMAT_PENALTY = -1.0
REFERENCE_TOOL_TAGS = ("search", "python")
"""The tool tags the reference's format check scans, whatever tools an env offers."""


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


def reference_format_check(response: str, tool_tags: Iterable[str] = TOOL_TAGS) -> FormatCheck:
    """The reference's format rules (``deep_research.validate_format``), over the raw response.

    Stricter than `check_format` in three ways: at least one ``<think>...</think>`` is required;
    the answer needs a literal ``\\boxed{`` (``\\boxed 5`` is bad format); and tags printed inside
    tool results count like the policy's own (a ``<answer>`` in a search result breaks the
    one-answer rule). A tool call needs a ``<result>...</result>`` somewhere after its closing
    tag, not necessarily right after it.

    Example:
        >>> reference_format_check("<answer>\\\\boxed{1}</answer>").reason
        'no <think>...</think> (the reference requires at least one)'
    """
    if response.count(THINK_OPEN) != response.count(THINK_CLOSE):
        return FormatCheck(False, "unbalanced <think> tags")
    if response.count(THINK_OPEN) == 0:
        return FormatCheck(False, "no <think>...</think> (the reference requires at least one)")
    if response.count(ANSWER_OPEN) != 1 or response.count(ANSWER_CLOSE) != 1:
        return FormatCheck(False, "the response must contain exactly one <answer> and one </answer>, "
                                  "tool results included")
    for tag in tool_tags:
        reason = _results_follow_calls(response, tag)
        if reason is not None:
            return FormatCheck(False, reason)
    start, end = response.find(ANSWER_OPEN), response.find(ANSWER_CLOSE)
    if start > end:
        return FormatCheck(False, "</answer> comes before <answer>")
    answer = response[start:end]
    if "\\boxed{" not in answer or "}" not in answer:
        return FormatCheck(False, "the answer has no \\boxed{...} (with braces)")
    return FormatCheck(True)


def _results_follow_calls(response: str, tag: str) -> str | None:
    """Why a ``<tag>`` call lacks its ``<result>`` in the reference's scan, or None when every call has one."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    position = 0
    while (call := response.find(open_tag, position)) != -1:
        result = response.find(RESULT_OPEN, call)
        close = response.find(close_tag, call)
        result_close = response.find(RESULT_CLOSE, result) if result != -1 else -1
        if -1 in (result, close, result_close):
            return f"a <{tag}> call has no {close_tag} or no <result>...</result> after it"
        if not close < result:
            return f"a <{tag}> call's <result> comes before its {close_tag}"
        position = result_close  # calls inside this result are skipped, as the reference scans
    return None


def reference_boxed(answer: str) -> str | None:
    """The reference's reading of the boxed answer (``remove_boxed(last_boxed_only_string(...))``).

    When ``\\boxed `` (with a space) occurs anywhere, the text after its last occurrence up to the
    first ``$`` wins; else the last ``\\boxed`` with the braces that follow it. None where the
    reference's extraction fails (no closing brace, ``\\fbox{}``, ``\\boxed\\text{}``), which it
    scores -1.

    Example:
        >>> reference_boxed("so \\\\boxed{\\\\frac{1}{2}}"), reference_boxed("\\\\boxed 7$ apples")
        ('\\\\frac{1}{2}', '7')
    """
    if "\\boxed " in answer:
        return answer.rsplit("\\boxed ", 1)[1].split("$", 1)[0]
    start = answer.rfind("\\boxed")
    if start == -1:
        return None
    close = closing_brace(answer, start)
    if close is None or not answer.startswith("\\boxed{", start):
        return None
    return answer[start + len("\\boxed{") : close]


_REFERENCE_CLOSED_ANSWERS = ("yes", "no", "noanswer")


def reference_f1(prediction: str, golds: Iterable[str]) -> float:
    """The reference's best token F1 over the gold aliases (``deep_research.get_f1_score``).

    Unlike `token_f1`, a pair where one side normalises to ``yes``, ``no`` or ``noanswer`` scores 0
    unless both are equal: ``"yes it is"`` against ``"yes"`` is 0, not 0.5.

    Example:
        >>> reference_f1("yes it is", ["yes"]), round(token_f1("yes it is", "yes"), 2)
        (0.0, 0.5)
    """
    predicted = normalize_answer(prediction)
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold)
        if predicted != expected and (predicted in _REFERENCE_CLOSED_ANSWERS or expected in _REFERENCE_CLOSED_ANSWERS):
            continue
        best = max(best, token_f1(prediction, gold))
    return best


def reference_reward(response: str, task: Task, tool_tags: Iterable[str] = TOOL_TAGS) -> Score:
    """The reference's ``compute_score`` (``deep_research``), spec §2 as its code computes it.

    -1 for bad format (`reference_format_check`) or an answer the reference cannot unbox; else
    `reference_f1` of the boxed answer over the gold aliases, plus 0.1 when F1 > 0 and both
    ``</search>`` and ``</python>`` occur in the response (tool results included, as there).
    The format check scans the reference's tags (`REFERENCE_TOOL_TAGS`) and the env's own, so a
    search-only env still fails a ``<python>`` call without a result, as ``compute_score`` does.
    The paper-mode rewards (``f1``/``em``/``math_verify`` with a format penalty) use rapo's
    `check_format`, which ignores tags inside tool results.
    """
    check = reference_format_check(response, tuple(dict.fromkeys((*REFERENCE_TOOL_TAGS, *tool_tags))))
    answer = None if not check.ok else reference_boxed(extract_answer(response) or "")
    if answer is None:
        reason = check.reason or "the reference cannot read the \\boxed{...} of the answer"
        return Score(FORMAT_PENALTY, {"format_ok": 0.0, "f1": 0.0, "em": 0.0}, format_error=reason)
    f1 = reference_f1(answer, task.answers)
    em = best_over_aliases(exact_match, answer, task.answers)
    bonus = MULTI_TOOL_BONUS if f1 > 0 and "</search>" in response and "</python>" in response else 0.0
    return Score(f1 + bonus, {"format_ok": 1.0, "f1": f1, "em": em})
