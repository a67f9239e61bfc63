"""The supervised warm-up: expert episodes tokenized as rollouts are, and behaviour cloning on a tiny model."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from rapo_agents.policies import ByteTokenizer, ScriptedPolicy
from rapo_agents.rollout import RolloutConfig, RolloutEngine
from rapo_agents.rollout.collate import collate_trajectories
from rapo_agents.scripted import ExpertAgent, run_text_episode
from rapo_agents.warmup import action_nll, behaviour_cloning, expert_episodes, tokenize_like_rollouts

ENV_KWARGS = {"num_tasks": 6, "difficulty": 2, "sandbox": "subprocess", "system_prompt": "Use python."}
BUDGETS = {"max_prompt_tokens": 512, "max_response_tokens": 1024}


def tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096))


@pytest.fixture(scope="module")
def episodes():
    import rapo_env  # noqa: F401  (registers the envs)

    env = gym.make("RAPO-Math-v0", disable_env_checker=True, **ENV_KWARGS)
    try:
        yield expert_episodes(env, num_episodes=6, tokenizer=ByteTokenizer(), **BUDGETS)
    finally:
        env.close()


def test_expert_episodes_match_what_the_rollout_engine_records(episodes):
    assert len(episodes) == 6 and all(t.reward == 1.0 and t.num_tool_calls >= 1 for t in episodes)
    expert = episodes[0]
    # The engine playing the expert's turns as a policy builds the very same token-level record.
    policy = ScriptedPolicy([step.action for step in expert.steps])
    with RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(**BUDGETS), env_kwargs=ENV_KWARGS) as engine:
        [played] = engine.run([0])
    assert played.reward == 1.0
    assert played.token_ids == expert.token_ids
    assert played.loss_mask == expert.loss_mask
    assert played.prompt_length == expert.prompt_length
    assert [(s.token_start, s.token_end) for s in played.steps] == [(s.token_start, s.token_end) for s in expert.steps]


def test_episodes_that_do_not_fit_the_budgets_are_dropped():
    import rapo_env  # noqa: F401

    env = gym.make("RAPO-Math-v0", disable_env_checker=True, **ENV_KWARGS)
    try:
        text = run_text_episode(env, ExpertAgent(env.unwrapped.tasks), task_index=0)
    finally:
        env.close()
    tokenizer = ByteTokenizer()
    assert tokenize_like_rollouts(text, tokenizer, 512, 1024) is not None
    assert tokenize_like_rollouts(text, tokenizer, 512, 1024, max_turn_tokens=8) is None  # a turn too long
    assert tokenize_like_rollouts(text, tokenizer, 512, 40) is None  # the response budget


def test_masked_tokens_carry_no_gradient(episodes):
    model = tiny_model()
    batch = collate_trajectories(episodes[:2], pad_token_id=0)
    kept = {}
    hook = model.get_decoder().register_forward_hook(
        lambda module, inputs, output: kept.update(hidden=output.last_hidden_state))
    try:
        nll, tokens = action_nll(model, batch)
        kept["hidden"].retain_grad()
        (nll / tokens).backward()
    finally:
        hook.remove()
    # The last hidden state at position t - 1 predicts token t; its gradient is zero unless that token is an action's.
    row_norms = kept["hidden"].grad[:, :-1].abs().sum(-1)
    predicts_action = batch["loss_mask"][:, 1:].bool()
    assert torch.all(row_norms[~predicts_action] == 0)
    assert torch.all(row_norms[predicts_action] > 0)
    # Tool results (mask 0 after the prompt) are present, and only policy tokens are counted.
    first = int(batch["prompt_lengths"].min())
    response_mask = batch["loss_mask"][:, first:]
    assert (response_mask == 0).logical_and(batch["attention_mask"][:, first:] == 1).any()
    assert tokens == batch["loss_mask"].sum()


def test_warm_up_lowers_the_nll_of_expert_actions(episodes):
    model = tiny_model()
    result = behaviour_cloning(model, episodes, pad_token_id=0, steps=12, batch_size=3, lr=1e-2, micro_batch_size=2,
                               show_progress=False)
    assert len(result.losses) == 12
    assert result.loss_after < 0.7 * result.loss_before
    with pytest.raises(ValueError, match="at least one episode"):
        behaviour_cloning(model, [], pad_token_id=0, steps=1, batch_size=1, lr=1e-3, show_progress=False)
