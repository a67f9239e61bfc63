"""Every format penalty says what was wrong (issue #18.5): ``Score.format_error`` and the final step's info."""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401  (registers the envs)
from rapo_env.protocol import format_result
from rapo_env.rewards.equivalence import MathVerifyReward
from rapo_env.rewards.judge import LLMJudgeReward
from rapo_env.rewards.qa import QA_REWARD_KINDS, QAReward
from rapo_env.rewards.text import FORMAT_PENALTY, reference_reward
from rapo_env.tasks.base import Task

TASK = Task(id="t", question="?", answers=("42",), source="toy")
BAD_RESPONSES = {
    "no_boxed": "<think>t</think><answer>42</answer>",
    "no_answer": "<think>t</think>42",
    "two_answers": "<think>t</think><answer>\\boxed{1}</answer><answer>\\boxed{42}</answer>",
    "unbalanced_think": "<think><answer>\\boxed{42}</answer>",
    "call_without_result": "<think>t</think><python>1</python><answer>\\boxed{42}</answer>",
}
PENALISING_REWARDS = {
    "reference": lambda: (lambda response, task: reference_reward(response, task)),
    "math_verify": MathVerifyReward,
    "judge": lambda: LLMJudgeReward({"base_url": "http://127.0.0.1:9/v1", "model": "judge"}),
    **{f"qa_{kind}": (lambda kind=kind: QAReward(kind, format_penalty=FORMAT_PENALTY)) for kind in QA_REWARD_KINDS},
}


@pytest.mark.parametrize("reward_name", sorted(PENALISING_REWARDS))
@pytest.mark.parametrize("case", sorted(BAD_RESPONSES))
def test_every_format_penalty_carries_a_format_error(reward_name, case):
    score = PENALISING_REWARDS[reward_name]()(BAD_RESPONSES[case], TASK)
    assert score.reward == FORMAT_PENALTY
    assert score.metrics["format_ok"] == 0.0
    assert isinstance(score.format_error, str) and score.format_error


def test_the_format_error_names_the_broken_rule():
    assert "boxed" in MathVerifyReward()(BAD_RESPONSES["no_boxed"], TASK).format_error
    assert "<result>" in reference_reward(BAD_RESPONSES["call_without_result"], TASK).format_error
    assert "think" in QAReward("em", format_penalty=-1.0)(BAD_RESPONSES["unbalanced_think"], TASK).format_error


@pytest.mark.parametrize("reward_name", sorted(PENALISING_REWARDS))
def test_a_well_formed_response_has_no_format_error(reward_name):
    good = "<think>t</think><python>print(42)</python>" + format_result("42") + "<answer>\\boxed{42}</answer>"
    assert PENALISING_REWARDS[reward_name]()(good, TASK).format_error is None


def test_a_correct_answer_without_boxed_says_why_in_the_final_step_info():
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess")
    try:
        env.reset(options={"task_index": 0})
        gold = env.unwrapped.task.answers[0]
        _, reward, terminated, _, info = env.step(f"<think>t</think><answer>{gold}</answer>")
        assert terminated and reward == FORMAT_PENALTY
        assert info["metrics"]["format_ok"] == 0.0
        assert "boxed" in info["format_error"]
    finally:
        env.close()
