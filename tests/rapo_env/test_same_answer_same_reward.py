"""The same correct answer earns the same default reward in every knowledge env (issue #29): a bare
``<answer>`` is +1 in RAPO-QA-v0 and in RAPO-Web-v0, not +1 in one and the format penalty in the other."""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401


@pytest.mark.parametrize("env_id", ["RAPO-QA-v0", "RAPO-Web-v0"])
def test_a_bare_correct_answer_scores_one_by_default(env_id):
    env = gym.make(env_id)
    try:
        env.reset(options={"task_index": 0})
        answer = env.unwrapped.task.answers[0]
        _, reward, terminated, _, _ = env.step(f"<answer>{answer}</answer>")
    finally:
        env.close()
    assert terminated and reward == 1.0
