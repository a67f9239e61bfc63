"""``reward="reference"`` scores as the reference's ``compute_score`` (deep_research) does.

Every row was derived by reading the reference function (RAPO commit 480af9d,
``verl/utils/reward_score/deep_research.py``) on that input; the expected value is its score.
"""

import pytest

from rapo_env.protocol import check_format, format_result
from rapo_env.rewards.qa import QAReward
from rapo_env.rewards.text import reference_boxed, reference_f1, reference_reward
from rapo_env.tasks.base import Task

THINK = "<think>t</think>"


def answer(text: str) -> str:
    return f"<answer>{text}</answer>"


def result(text: str) -> str:
    return format_result(text)


PARIS = ("Paris",)
CASES = [
    # name, response, gold aliases, the reference's score
    ("no_think_at_all", answer("\\boxed{Paris}"), PARIS, -1.0),
    ("think_and_boxed", THINK + answer("\\boxed{Paris}"), PARIS, 1.0),
    ("think_after_answer", answer("\\boxed{Paris}") + THINK, PARIS, 1.0),
    ("unbalanced_think", "<think>a<think>b</think>" + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("two_answers", THINK + answer("\\boxed{x}") + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("no_answer", THINK + "Paris", PARIS, -1.0),
    ("answer_not_closed", THINK + "<answer>\\boxed{Paris}", PARIS, -1.0),
    ("close_before_open", THINK + "</answer>\\boxed{Paris}<answer>", PARIS, -1.0),
    ("boxed_without_braces", THINK + answer("\\boxed Paris"), PARIS, -1.0),
    ("no_boxed", THINK + answer("Paris"), PARIS, -1.0),
    ("fbox_only", THINK + answer("\\fbox{Paris}"), PARIS, -1.0),
    ("boxed_brace_never_closed", THINK + answer("\\boxed{Paris"), PARIS, -1.0),
    ("closing_brace_only_before_boxed", THINK + answer("} \\boxed{Paris"), PARIS, -1.0),
    ("last_boxed_has_no_braces", THINK + answer("\\boxed{Paris} and \\boxed"), PARIS, -1.0),
    ("last_boxed_is_boxed_text", THINK + answer("\\boxed{x}\\boxed\\text{Paris}"), PARIS, -1.0),
    ("spaced_boxed_wins_over_braces", THINK + answer("\\boxed{London} so \\boxed Paris"), PARIS, 1.0),
    ("spaced_boxed_stops_at_dollar", THINK + answer("\\boxed{x} is $\\boxed Paris$ "), PARIS, 1.0),
    ("empty_boxed", THINK + answer("\\boxed{}"), PARIS, 0.0),
    ("wrong_answer", THINK + answer("\\boxed{London}"), PARIS, 0.0),
    ("partial_f1", THINK + answer("\\boxed{New York City}"), ("New York",), 0.8),
    ("normalised_articles_and_punctuation", THINK + answer("\\boxed{eiffel tower!}"), ("The Eiffel Tower",), 1.0),
    ("latex_answer_vs_plain_gold", THINK + answer("\\boxed{\\frac{1}{2}}"), ("1/2",), 0.0),
    ("best_alias", THINK + answer("\\boxed{new york}"), ("NYC", "New York"), 1.0),
    ("yes_prediction_longer_than_yes_gold", THINK + answer("\\boxed{yes it is}"), ("yes",), 0.0),
    ("yes_equal_after_normalisation", THINK + answer("\\boxed{yes.}"), ("Yes",), 1.0),
    ("no_against_yes", THINK + answer("\\boxed{no}"), ("yes",), 0.0),
    ("no_gold_with_longer_prediction", THINK + answer("\\boxed{no way}"), ("no",), 0.0),
    ("noanswer_prediction", THINK + answer("\\boxed{noanswer}"), ("no answer",), 0.0),
    ("yes_alias_skipped_other_alias_matches", THINK + answer("\\boxed{yes it is}"), ("yes", "yes it is"), 1.0),
    ("search_and_python_bonus",
     THINK + "<search>q</search>" + result("r") + "<python>1</python>" + result("1") + answer("\\boxed{Paris}"),
     PARIS, 1.1),
    ("bonus_needs_positive_f1",
     THINK + "<search>q</search>" + result("r") + "<python>1</python>" + result("1") + answer("\\boxed{London}"),
     PARIS, 0.0),
    ("one_tool_no_bonus", THINK + "<search>q</search>" + result("r") + answer("\\boxed{Paris}"), PARIS, 1.0),
    ("call_without_result", THINK + "<python>1</python>" + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("result_not_right_after_call",
     THINK + "<python>1</python> some text" + result("1") + answer("\\boxed{Paris}"), PARIS, 1.0),
    ("result_before_call", THINK + result("x") + "<python>1</python>" + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("two_calls_with_results",
     THINK + "<python>a</python>" + result("1") + "<python>b</python>" + result("2") + answer("\\boxed{Paris}"),
     PARIS, 1.0),
    ("second_call_without_result",
     THINK + "<python>a</python>" + result("1") + "<python>b</python>" + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("answer_inside_a_tool_result",
     THINK + "<search>q</search>" + result("<answer>x</answer>") + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("python_call_printed_inside_a_search_result",
     THINK + "<search>q</search>" + result("see <python>code</python>") + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("think_inside_a_tool_result",
     THINK + "<search>q</search>" + result("<think>") + answer("\\boxed{Paris}"), PARIS, -1.0),
    ("closing_python_tag_in_a_result_earns_the_bonus",
     THINK + "<search>q</search>" + result("print(1) </python>") + answer("\\boxed{Paris}"), PARIS, 1.1),
    ("stray_closing_search_tag_earns_the_bonus",
     THINK + "<python>1</python>" + result("1") + "</search>" + answer("\\boxed{Paris}"), PARIS, 1.1),
]


@pytest.mark.parametrize(("response", "golds", "expected"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_reference_reward_matches_the_reference_compute_score(response, golds, expected):
    task = Task(id="t", question="?", answers=golds, source="toy")
    score = reference_reward(response, task)
    assert score.reward == pytest.approx(expected)
    assert score.metrics["format_ok"] == float(expected != -1.0)
    assert (score.format_error is not None) == (expected == -1.0)


def test_the_table_has_at_least_thirty_distinct_cases():
    assert len(CASES) >= 30
    assert len({case[0] for case in CASES}) == len(CASES)
    assert len({case[1:3] for case in CASES}) == len(CASES)


def test_paper_mode_format_check_still_ignores_tags_inside_tool_results():
    response = THINK + "<search>q</search>" + result("see <python>code</python> <answer>x</answer>")
    response += answer("\\boxed{Paris}")
    assert check_format(response).ok
    assert reference_reward(response, Task(id="t", question="?", answers=PARIS, source="toy")).reward == -1.0


def test_reference_f1_and_boxed_reading_agree_with_the_reference_on_their_own():
    assert reference_f1("yes it is", ["yes"]) == 0.0
    assert reference_f1("Paris", []) == 0.0
    assert reference_boxed("\\boxed 7$ apples") == "7"
    assert reference_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert reference_boxed("\\fbox{1}") is None


def test_qa_reward_reference_kind_reports_the_reference_format_verdict():
    task = Task(id="t", question="?", answers=PARIS, source="toy")
    score = QAReward("reference")(answer("\\boxed{Paris}"), task)  # no <think>: fine for rapo, not for the reference
    assert score.reward == -1.0
    assert score.metrics["format_ok"] == 0.0
    assert "think" in score.format_error
    assert score.metrics["f1"] == 1.0  # the comparable metrics still score the answer


@pytest.mark.parametrize("env_tags", [("search",), ("python",)])
def test_a_single_tool_env_checks_every_tool_tag_as_compute_score_does(env_tags):
    """compute_score scans both <search> and <python> whatever the env offers: a call of the other tool
    without its result is bad format there, so it is here."""
    task = Task(id="t", question="?", answers=("Paris",), source="toy")
    other = "python" if env_tags == ("search",) else "search"
    response = f"{THINK}<{other}>x</{other}>{answer(chr(92) + 'boxed{Paris}')}"
    assert QAReward("reference", env_tags)(response, task).reward == -1.0
    assert reference_reward(response, task, env_tags).reward == -1.0
