"""`RapoRollout` answers TRL's rollout_func contract with whole rapo episodes, token in, token out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rapo_agents.integrations.trl_rollout import RapoRollout, rapo_reward, task_dataset
from rapo_agents.rollout import RolloutConfig

ENV_KWARGS = {"num_tasks": 4, "sandbox": "subprocess"}


@pytest.fixture(scope="module")
def trainer(tiny_policy):
    """What RapoRollout reads of a TRL trainer: the model, its tokenizer and the global step."""
    return SimpleNamespace(model=tiny_policy.model, processing_class=tiny_policy.tokenizer,
                           state=SimpleNamespace(global_step=3))


@pytest.fixture(scope="module")
def answered(trainer):
    rollout = RapoRollout("RAPO-Math-v0", env_kwargs=ENV_KWARGS, config=RolloutConfig(max_response_tokens=48,
                                                                                      max_turn_tokens=16))
    try:
        yield rollout(["2", "2", "2", "0", "0", "0"], trainer)
    finally:
        rollout.close()


def test_trls_repeated_prompts_become_groups_with_one_prompt_each(answered):
    assert len(answered["prompt_ids"]) == 6
    assert answered["prompt_ids"][0] == answered["prompt_ids"][1] == answered["prompt_ids"][2]
    assert answered["prompt_ids"][0] != answered["prompt_ids"][3]


def test_completions_carry_the_loss_mask_and_sampler_logprobs_of_the_episode(answered):
    for completion, mask, logprobs in zip(answered["completion_ids"], answered["env_mask"], answered["logprobs"],
                                          strict=True):
        assert len(completion) == len(mask) == len(logprobs) <= 48
        assert mask[0] == 1  # a completion opens with the policy's turn
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
    # The random model's turns call no tool: the env's hints follow them, masked out of TRL's loss.
    assert any(0 in mask for mask in answered["env_mask"])


def test_the_envs_reward_is_trls_reward(answered):
    assert rapo_reward([None] * 6, rapo_reward=answered["rapo_reward"]) == answered["rapo_reward"]
    assert all(-1.0 <= r <= 1.0 for r in answered["rapo_reward"])


def test_prompts_that_are_not_task_indices_get_a_clear_error(trainer):
    rollout = RapoRollout("RAPO-Math-v0", env_kwargs=ENV_KWARGS)
    with pytest.raises(ValueError, match="task indices"):
        rollout(["What is 2 + 2?"], trainer)
    with pytest.raises(ValueError, match="same number of times"):
        rollout(["1", "1", "2"], trainer)


def test_the_dataset_lists_task_indices():
    assert task_dataset(3)["prompt"] == ["0", "1", "2"]
