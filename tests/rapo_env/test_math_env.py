"""RAPO-Math-v0 follows the ToolEnv contract: one turn per step, last tool call runs, answers end episodes."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ResetNeeded

import rapo_env  # noqa: F401
from rapo_env.protocol import RESULT_OPEN
from rapo_env.tasks.procedural_math import ProceduralMath


@pytest.fixture
def env():
    env = gym.make("RAPO-Math-v0", num_tasks=8, sandbox="subprocess")
    yield env
    env.close()


def test_reset_gives_the_prompt_and_the_system_prompt_but_never_the_answer(env):
    prompt, info = env.reset(seed=0, options={"task_index": 2, "rollout_index": 5})
    task = env.unwrapped.tasks[2]
    assert prompt == task.question
    assert "<python>" in info["system_prompt"] and "\\boxed{}" in info["system_prompt"]
    assert (info["task_index"], info["rollout_index"], info["tools"]) == (2, 5, ["python"])
    assert task.answers[0] not in repr(info)


def test_only_the_last_tool_call_of_a_turn_runs(env):
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(
        "<python>print('first')</python><python>print('second')</python>")
    assert observation == " <result>\nsecond\n</result>"
    assert info["format_error"].startswith("several tool calls")
    assert (reward, terminated, truncated, info["tool"], info["tool_ok"]) == (0.0, False, False, "python", True)


def test_a_correct_answer_terminates_with_reward_one(env):
    env.reset(seed=0, options={"task_index": 0})
    answer = env.unwrapped.tasks[0].answers[0]
    env.step(f"<python>print({answer})</python>")
    observation, reward, terminated, truncated, info = env.step(f"<answer>\\boxed{{{answer}}}</answer>")
    assert (observation, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["metrics"] == {"format_ok": 1.0, "accuracy": 1.0} and info["episode_end"] == "answer"


def test_the_tool_call_limit_truncates_with_the_format_penalty():
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess", max_tool_calls=2, max_turns=10)
    env.reset(seed=0)
    for _ in range(2):
        assert not env.step("<python>1</python>")[3]
    observation, reward, terminated, truncated, info = env.step("<python>1</python>")
    assert truncated and not terminated and reward == -1.0
    assert info["episode_end"] == "tool_limit" and "limit of 2" in observation
    env.close()


def test_the_turn_limit_truncates(env):
    env.reset(seed=0)
    results = [env.step("I am just chatting") for _ in range(env.unwrapped.max_turns)]
    assert [r[3] for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1][4]["episode_end"] == "turn_limit"


@pytest.mark.parametrize("action, error", [
    ("", "no tool call and no answer"),
    ("just words", "no tool call and no answer"),
    ("<python>print(1)", "unclosed <python> tag"),
    ("x" * 1_000_000, "no tool call and no answer"),
    ("\x00\x01\ud800 ∑ 😀", "no tool call and no answer"),
])
def test_bad_turns_get_an_explaining_observation_instead_of_an_exception(env, action, error):
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(action)
    assert info["format_error"] == error
    assert observation.startswith(RESULT_OPEN, 1) and not terminated
    assert env.observation_space.contains(observation)


def test_bad_code_is_a_failed_tool_result_not_a_crash(env):
    env.reset(seed=0)
    observation, *_, info = env.step("<python>1/0</python>")
    assert "ZeroDivisionError" in observation and info["tool_ok"] is False


def test_step_after_the_end_raises_a_clear_error(env):
    env.reset(seed=0)
    env.step("<answer>\\boxed{0}</answer>")
    with pytest.raises(ResetNeeded, match="reset"):
        env.step("<python>1</python>")


def test_make_overrides_dataset_split_limits_and_reward(shared_data):
    env = gym.make("RAPO-Math-v0", dataset=str(shared_data / "math/gsm8k_test.jsonl"), max_tool_calls=5,
                   reward="reference", sandbox="subprocess")
    prompt, _ = env.reset(seed=0, options={"task_index": 0})
    assert prompt.startswith("Janet") and env.unwrapped.max_tool_calls == 5
    assert env.step("<think>t</think><answer>\\boxed{18}</answer>")[1] == 1.0  # the reference needs a <think>
    env.close()
    test_split = gym.make("RAPO-Math-v0", split="test", num_tasks=3, sandbox="subprocess")
    assert test_split.unwrapped.tasks[0].id.startswith("procmath-s104729")
    test_split.close()


def scripted_actions(observations):
    """A stateless scripted agent: compute on the prompt, answer after a result, sometimes misbehave."""
    actions = []
    for index, observation in enumerate(observations):
        if RESULT_OPEN in observation:
            actions.append("<answer>\\boxed{42}</answer>")
        elif index % 7 == 3:
            actions.append("no tags at all ∑")
        else:
            actions.append("<python>print(6 * 7)</python>")
    return actions


@pytest.mark.parametrize("mode, vector_kwargs", [
    ("sync", {}),
    ("async", {}),
    ("async", {"shared_memory": False}),
])
def test_vector_envs_carry_unicode_text_intact(mode, vector_kwargs):
    envs = gym.make_vec("RAPO-Math-v0", num_envs=3, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                        num_tasks=4, sandbox="subprocess")
    observations, infos = envs.reset(seed=0)
    questions = {task.question for task in ProceduralMath(seed=0, num_tasks=4)}
    assert set(observations) <= questions
    observations, rewards, terminated, truncated, infos = envs.step(
        ["<python>print('∑ 你好 😀')</python>"] * 3)
    assert list(observations) == [" <result>\n∑ 你好 😀\n</result>"] * 3
    envs.close()


def test_a_64_env_async_vector_env_runs_a_thousand_steps():
    envs = gym.make_vec("RAPO-Math-v0", num_envs=64, vectorization_mode="async", num_tasks=16, sandbox="subprocess")
    observations, _ = envs.reset(seed=0)
    steps = episodes = 0
    while steps < 1000:
        observations, rewards, terminated, truncated, infos = envs.step(scripted_actions(observations))
        steps += envs.num_envs
        episodes += int(np.sum(terminated | truncated))
    envs.close()
    assert episodes > 64


def test_the_short_system_prompt_states_the_same_protocol_in_three_sentences():
    import gymnasium as gym

    from rapo_env.prompts import SHORT_MATH_PROMPT

    env = gym.make("RAPO-Math-v0", num_tasks=2, system_prompt="short", sandbox="subprocess")
    _, info = env.reset(seed=0)
    env.close()
    assert info["system_prompt"] == SHORT_MATH_PROMPT
    for tag in ("<think>", "<python>", "<result>", "<answer>", "\\boxed"):
        assert tag in SHORT_MATH_PROMPT
