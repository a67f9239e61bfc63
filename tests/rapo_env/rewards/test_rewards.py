"""Math and text rewards, on real answers."""

import json
import re

import pytest

from rapo_env.protocol import format_result
from rapo_env.rewards.equivalence import MathVerifyReward, answers_equivalent
from rapo_env.rewards.text import exact_match, normalize_answer, reference_reward, substring_match, token_f1
from rapo_env.tasks.base import Task


def answered(answer: str) -> str:
    return f"<think>done</think><answer>So \\boxed{{{answer}}}</answer>"


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"


def test_text_metrics():
    assert token_f1("new york city", "New York") == pytest.approx(0.8)
    assert token_f1("paris", "london") == 0.0
    assert exact_match("The Beatles", "beatles") == 1.0
    assert substring_match("it was the Beatles band", "Beatles") == 1.0


def test_reference_reward_follows_spec_section_2():
    task = Task(id="t", question="?", answers=("New York", "NYC"), source="toy")
    assert reference_reward("no format", task).reward == -1.0
    assert reference_reward(answered("Boston"), task).reward == 0.0
    assert reference_reward(answered("New York City"), task).reward == pytest.approx(0.8)
    both_tools = ("<search>q</search>" + format_result("r") + "<python>1</python>" + format_result("1")
                  + answered("nyc"))
    assert reference_reward(both_tools, task).reward == pytest.approx(1.1)


def math500_answers(shared_data, count=40):
    rows = [json.loads(line) for line in (shared_data / "math/math500_test.jsonl").open()]
    return [row["answer"] for row in rows[:count]]


def rewrite(answer: str) -> str | None:
    """An equivalent but differently written form of a MATH500 answer, where one is easy to make."""
    if re.fullmatch(r"-?\d+", answer):
        return f"{answer}.0"
    match = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", answer)
    if match:
        return f"{match[1]}/{match[2]}"
    match = re.fullmatch(r"\\dfrac\{(-?\d+)\}\{(\d+)\}", answer)
    if match:
        return f"\\frac{{{match[1]}}}{{{match[2]}}}"
    return None


def test_math500_answers_score_one_when_equivalent_and_zero_when_wrong(shared_data):
    reward = MathVerifyReward()
    checked = 0
    for gold in math500_answers(shared_data):
        task = Task(id="m", question="?", answers=(gold,), source="math500")
        assert reward(answered(gold), task).reward == 1.0, gold
        rewritten = rewrite(gold)
        if rewritten is not None:
            assert reward(answered(rewritten), task).reward == 1.0, (gold, rewritten)
            checked += 1
        assert reward(answered("\\frac{9999}{7}"), task).reward == 0.0, gold
    assert checked >= 15


def test_math_reward_penalises_bad_format():
    task = Task(id="m", question="?", answers=("2",), source="toy")
    assert MathVerifyReward()("the answer is 2", task).reward == -1.0


def test_equivalence_handles_expressions_and_gives_up_on_pathological_input():
    assert answers_equivalent("0.5", "\\frac{1}{2}")
    assert answers_equivalent("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert not answers_equivalent("\\frac{14}{3}", "4.67")
    assert not answers_equivalent("9" * 5000, "3")
    assert answers_equivalent("1,000", "1000")
