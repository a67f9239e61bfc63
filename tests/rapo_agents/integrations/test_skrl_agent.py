"""skrl's SequentialTrainer trains a tiny random LLM on a rapo env through the token-id wrappers, end to end."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

pytest.importorskip("skrl", reason="the [skrl] extra is not installed")

from skrl.trainers.torch import SequentialTrainer  # noqa: E402

from rapo_agents.integrations.skrl_agent import RapoSkrlAgent, RapoSkrlAgentCfg, make_skrl_env  # noqa: E402
from rapo_agents.policies import HFPolicy  # noqa: E402
from rapo_agents.rollout import RolloutConfig  # noqa: E402
from rapo_env.wrappers.token_ids import TokenCodec  # noqa: E402

ENV_KWARGS = {"num_tasks": 2, "sandbox": "subprocess", "max_turns": 2}


@pytest.fixture(scope="module")
def tokenizer_dir(policy_tokenizer_dir) -> str:
    """SmolLM2's tokenizer (byte-level BPE: exact round trips), loaded by path as a spec rebuild would."""
    return policy_tokenizer_dir


@pytest.fixture()
def tiny_policy(tokenizer_dir) -> HFPolicy:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048)
    return HFPolicy(LlamaForCausalLM(config).eval(), tokenizer)


def test_sequential_trainer_runs_rapo_updates(tokenizer_dir, tiny_policy, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # skrl's default experiment folder is ./runs: nothing may appear there
    env = make_skrl_env("RAPO-Math-v0", tokenizer_dir, num_envs=2, observation_tokens=512, action_tokens=16,
                        env_kwargs=ENV_KWARGS)
    system_prompt = gym.make("RAPO-Math-v0", **ENV_KWARGS).reset(seed=0)[1]["system_prompt"]
    cfg = RapoSkrlAgentCfg(episodes_per_update=4, rollout=RolloutConfig(max_turn_tokens=8, max_response_tokens=256),
                           learning_rate=1e-2, micro_batch_size=4)
    agent = RapoSkrlAgent(
        policy=tiny_policy, system_prompt=system_prompt, cfg=cfg,
        observation_codec=TokenCodec(tokenizer_dir, 512), action_codec=TokenCodec(tokenizer_dir, 16),
        observation_space=env.observation_space, action_space=env.action_space, device="cpu",
    )
    before = [p.detach().clone() for p in tiny_policy.model.parameters()]
    trainer = SequentialTrainer(env=env, agents=agent, cfg={"timesteps": 8, "headless": True,
                                                            "disable_progressbar": True,
                                                            "close_environment_at_exit": False})
    try:
        trainer.train()
    finally:
        env.close()

    # 8 timesteps x 2 envs, 2 turns per episode (turn limit): 8 episodes, 2 updates of 4.
    assert len(agent.update_stats) == 2
    assert all(torch.isfinite(torch.tensor(s["loss/policy_loss"])) for s in agent.update_stats)
    changed = [not torch.equal(a, b.detach()) for a, b in zip(before, tiny_policy.model.parameters(), strict=True)]
    assert any(changed)
    # SAME_STEP autoreset: no recorded step is a reset's dummy transition, so 16 turns make exactly 8 episodes.
    assert agent.episodes_started == 8 and [s["rapo/episodes"] for s in agent.update_stats] == [4.0, 4.0]
    assert not agent.finished and all(episode is None for episode in agent.episodes)
    assert not (tmp_path / "runs").exists()  # no checkpoints (they would pickle the LLM), no event files


def test_checkpoints_are_refused():
    from skrl.agents.torch.base import ExperimentCfg

    with pytest.raises(ValueError, match="pickle"):
        RapoSkrlAgentCfg(experiment=ExperimentCfg(checkpoint_interval=100)).validate()
