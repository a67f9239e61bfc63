"""A math answer is compared as mathematics, never through the SQuAD text normalisation.

The text normalisation drops every punctuation mark, so a sign, a decimal point, a fraction bar,
an exponent or a bracket would vanish; a math reward must see them all.
"""

import pytest

from rapo_env.rewards.equivalence import MathVerifyReward, answers_equivalent
from rapo_env.tasks.base import Task

DIFFERENT = [
    ("3", "-3"),
    ("-5", "5"),
    ("x-1", "x+1"),
    ("12", "1/2"),
    ("314", "3.14"),
    ("210", "2^{10}"),
    ("(1,2]", "[1,2)"),
    ("1,2", "12"),
    (".", "(A)"),
    ("()", "(A)"),
    ("-", "(A)"),
]

SAME = [
    ("0.5", "\\frac{1}{2}"),
    ("1,000", "1000"),
    ("$5", "5"),
    ("50%", "50"),
    ("  7 ", "7"),
    ("1.0", "1"),
    ("2^{10}", "1024"),
    ("(A)", "(A)"),
]


@pytest.mark.parametrize(("prediction", "gold"), DIFFERENT)
def test_answers_that_differ_only_in_punctuation_are_different(prediction, gold):
    assert not answers_equivalent(prediction, gold)


@pytest.mark.parametrize(("prediction", "gold"), SAME)
def test_equal_answers_in_other_forms_are_equal(prediction, gold):
    assert answers_equivalent(prediction, gold)


def test_the_math_reward_scores_a_wrong_sign_zero():
    task = Task(id="t", question="?", answers=("-3",), source="toy")
    assert MathVerifyReward()("<answer>\\boxed{3}</answer>", task).reward == 0.0
    assert MathVerifyReward()("<answer>\\boxed{-3}</answer>", task).reward == 1.0


@pytest.mark.parametrize(("prediction", "gold"), [
    ("1000000000999", "1000000000000"),
    ("9007199254740993", "9007199254740992"),  # past 2^53, where floats can no longer tell them apart
    ("1e-10", "0"),
    ("0.000001", "0"),
    ("3.0001", "3"),
])
def test_numbers_that_differ_are_different(prediction, gold):
    assert not answers_equivalent(prediction, gold)


@pytest.mark.parametrize(("prediction", "gold"), [
    ("9007199254740993", "9007199254740993.0"),
    ("0", "0.0"),
    ("0.30000000000000004", "0.3"),  # a float's rounding, within the relative tolerance
    ("1e3", "1000"),
])
def test_numbers_that_are_equal_are_equal(prediction, gold):
    assert answers_equivalent(prediction, gold)


def test_rapo_eval_grades_math_answers_the_same_way():
    from rapo_agents.evaluation import score_answer

    assert score_answer("3", ["-3"], "math") == {"accuracy": 0.0}
    assert score_answer("\\frac{1}{2}", ["0.5"], "math") == {"accuracy": 1.0}
