"""RAPO on verl: the registered functions give rapo's numbers; config, trainer and data plumbing load.

verl is installed without its GPU stack (``pip install --no-deps verl`` plus its light deps), so
everything here runs on CPU; a real verl training run is the GPU-marked test at the end.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed")

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

import rapo_agents.integrations.verl  # noqa: E402,F401  (registers rapo with verl)
from rapo_agents.integrations.verl.protocol import (  # noqa: E402
    episode_fields,
    retrieval_terms_from_fields,
    shaping_factor,
)
from rapo_agents.rapo import (  # noqa: E402
    RAPOConfig,
    rapo_advantages,
    rapo_policy_loss,
    retrieval_entropy_pairs,
    retrieval_reward,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def actor_config(**changes) -> ActorConfig:
    settings = dict(strategy="fsdp", clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    settings.update(changes)
    return ActorConfig(ppo_micro_batch_size_per_gpu=1, rollout_n=1, **settings)


@pytest.fixture()
def batch():
    generator = torch.Generator().manual_seed(0)
    rows, width = 6, 9
    lengths = torch.tensor([9, 7, 5, 9, 3, 8])
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).float()
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2])
    token_rewards = torch.zeros(rows, width)
    token_rewards[torch.arange(rows), lengths - 1] = rewards  # verl puts the outcome on the last token
    return {
        "mask": mask,
        "rewards": rewards,
        "token_rewards": token_rewards,
        "index": np.array(["q1", "q1", "q1", "q2", "q2", "q3"], dtype=object),
        "group": torch.tensor([0, 0, 0, 1, 1, 2]),
        "z_ret": torch.tensor([0.0, 0.4, -0.1, 0.0, 0.3, 0.0]),
        "f_ret": torch.tensor([0.0, 0.25, 0.1, 0.0, 0.5, 0.0]),
        "old": -torch.rand(rows, width, generator=generator) * 3,
        "new": -torch.rand(rows, width, generator=generator) * 3,
    }


def test_the_registries_hold_rapo():
    assert core_algos.get_adv_estimator_fn("rapo").__module__ == "rapo_agents.integrations.verl.algos"
    assert core_algos.get_policy_loss_fn("rapo").__module__ == "rapo_agents.integrations.verl.algos"


def test_registered_estimator_matches_rapo_advantages(batch):
    estimator = core_algos.get_adv_estimator_fn("rapo")
    advantages, returns = estimator(
        token_level_rewards=batch["token_rewards"],
        response_mask=batch["mask"],
        index=batch["index"],
        config=None,
        retrieval_reward=batch["z_ret"],
        advantage_weight=0.3,
    )
    expected = rapo_advantages(batch["rewards"], batch["z_ret"], batch["group"], advantage_weight=0.3)
    torch.testing.assert_close(advantages, expected.unsqueeze(-1) * batch["mask"])
    torch.testing.assert_close(returns, advantages)
    assert advantages[5].abs().sum() > 0  # a group of one: mean 0, std 1, as in verl


def test_without_retrieval_it_is_verls_own_grpo(batch):
    ours, _ = core_algos.get_adv_estimator_fn("rapo")(batch["token_rewards"], batch["mask"], batch["index"])
    grpo, _ = core_algos.compute_grpo_outcome_advantage(batch["token_rewards"], batch["mask"], batch["index"])
    torch.testing.assert_close(ours, grpo)


def test_registered_loss_matches_rapo_policy_loss_with_shaping(batch):
    shaping_weight = 0.05
    advantages = rapo_advantages(batch["rewards"], batch["z_ret"], batch["group"]).unsqueeze(-1) * batch["mask"]
    new_ours = batch["new"].clone().requires_grad_(True)
    new_rapo = batch["new"].clone().requires_grad_(True)
    loss, metrics = core_algos.get_policy_loss_fn("rapo")(
        old_log_prob=batch["old"],
        log_prob=new_ours,
        advantages=advantages,
        response_mask=batch["mask"].bool(),
        loss_agg_mode="token-mean",
        config=actor_config(),
        rollout_is_weights=shaping_factor(batch["f_ret"], batch["mask"], shaping_weight),
    )
    expected = rapo_policy_loss(
        new_rapo, batch["old"], advantages, batch["mask"], f_ret=batch["f_ret"],
        config=RAPOConfig(shaping_weight=shaping_weight),
    )
    torch.testing.assert_close(loss, expected.loss)
    loss.backward()
    expected.loss.backward()
    torch.testing.assert_close(new_ours.grad, new_rapo.grad)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(expected.clip_fraction.item())
    assert metrics["actor/rapo_shaping_factor"] == pytest.approx(1 + shaping_weight * batch["f_ret"].mean().item())


@pytest.mark.parametrize("batch_info", [{}, {"dp_size": 2, "batch_num_tokens": 70}], ids=["local", "global"])
def test_unshaped_loss_equals_verls_vanilla_ppo_clip(batch, batch_info):
    advantages = torch.randn(batch["mask"].shape, generator=torch.Generator().manual_seed(1)) * batch["mask"]
    config = actor_config()
    config.global_batch_info.update(batch_info)
    arguments = dict(
        old_log_prob=batch["old"], log_prob=batch["new"], advantages=advantages, response_mask=batch["mask"].bool(),
        loss_agg_mode="token-mean", config=config,
    )
    ours, _ = core_algos.get_policy_loss_fn("rapo")(**arguments)
    vanilla, _ = core_algos.get_policy_loss_fn("vanilla")(**arguments)
    torch.testing.assert_close(ours, vanilla)


def test_loss_refuses_other_aggregations(batch):
    with pytest.raises(ValueError, match="token mean"):
        core_algos.get_policy_loss_fn("rapo")(
            batch["old"], batch["new"], batch["mask"], batch["mask"], "seq-mean-token-sum", actor_config()
        )


def test_retrieval_terms_from_the_data_protocol():
    entropy = torch.tensor([
        [2.0, 2.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.5],   # steps (0,2) and (4,6); retrieval after step 0
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],   # one step, no retrieval
        [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],   # a row from another agent loop: no record
    ])
    fields = [episode_fields([(0, 2), (4, 6), (7, 8)], [1, 0, 1], 3, 8), episode_fields([(0, 3)], [0], 0, 3)]
    z_ret, f_ret = retrieval_terms_from_fields(entropy, fields + [None])
    h_pre, h_post, valid = retrieval_entropy_pairs(
        torch.tensor([[2.0, 2.0, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]),
        torch.tensor([[1, 0, 1], [0, 0, 0], [0, 0, 0]]),
    )
    torch.testing.assert_close(z_ret, retrieval_reward(h_pre, h_post, valid))
    assert z_ret[0].item() == pytest.approx(math.tanh(0.0) * 2.0) and z_ret[1].item() == 0.0
    torch.testing.assert_close(f_ret, torch.tensor([3 / 8, 0.0, 0.0]))
    with pytest.raises(ValueError):
        episode_fields([(0, 9)], [0], 0, 8)


def test_the_verl_config_composes_and_passes_verls_checks():
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        config = compose(config_name="verl_rapo_7b", overrides=["+ray_kwargs.ray_init.runtime_env.env_vars.X=1"])
    assert config.algorithm.adv_estimator == "rapo" and config.actor_rollout_ref.actor.policy_loss.loss_mode == "rapo"
    assert config.trainer.v1.trainer_mode == "rapo" and config.rapo.shaping_weight == 0.05
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28 and config.actor_rollout_ref.rollout.n == 16
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def test_launch_script_composes_its_config_with_rapo_registered():
    """The launch script end to end short of Ray: Hydra prints the job config (``--cfg job``) after
    ``import verl`` has imported rapo's registrations (VERL_USE_EXTERNAL_MODULES; a failed import aborts)."""
    result = subprocess.run(
        ["bash", "scripts/verl/run_rapo_7b.sh", "trainer.n_gpus_per_node=1", "--cfg", "job", "--resolve"],
        cwd=REPO_ROOT, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "adv_estimator: rapo" in result.stdout and "loss_mode: rapo" in result.stdout
    assert "trainer_mode: rapo" in result.stdout
    assert "VERL_USE_EXTERNAL_MODULES: rapo_agents.integrations.verl" in result.stdout
    assert "agent_loop_config_path: " + str(REPO_ROOT / "configs" / "verl_agent_loops.yaml") in result.stdout


def test_agent_loop_entry_resolves():
    from omegaconf import OmegaConf

    from rapo_agents.integrations.verl.agent_loop import RapoEnvAgentLoop
    from verl.utils.import_utils import load_class_from_fqn

    entry = OmegaConf.load(REPO_ROOT / "configs" / "verl_agent_loops.yaml")[0]
    assert entry.name == "rapo_env_agent"
    assert load_class_from_fqn(entry._target_, "agent loop") is RapoEnvAgentLoop


def test_prepared_rows_round_trip_through_parquet(tmp_path):
    import pyarrow.parquet as pq

    from rapo_agents.integrations.verl.data import verl_rows, write_parquet

    rows = verl_rows("RAPO-Math-v0", {"num_tasks": 4, "sandbox": "subprocess", "split": "validation"})
    table = pq.read_table(write_parquet(rows, tmp_path / "validation.parquet")).to_pylist()
    assert [row["extra_info"]["task_index"] for row in table] == [0, 1, 2, 3]
    assert table[2]["prompt"][1]["content"] == rows[2]["prompt"][1]["content"]
    assert table[0]["extra_info"]["env_kwargs"]["split"] == "validation"


class ScriptedServer:
    """verl's rollout-server interface (``generate`` -> ``TokenOutput``) over a real rapo ScriptedPolicy."""

    def __init__(self, policy):
        self.policy = policy
        self.requests = []

    async def generate(self, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        from rapo_agents.policies import SamplingParams

        self.requests.append(sampling_params)
        params = SamplingParams(max_new_tokens=sampling_params["max_tokens"], stop=tuple(sampling_params["stop"]))
        generation = self.policy.generate([prompt_ids], params)[0]
        return TokenOutput(token_ids=generation.token_ids, log_probs=generation.logprobs, stop_reason="completed")


@pytest.mark.parametrize("session_id", [0, 1], ids=["on-policy", "hybrid"])
def test_agent_loop_plays_a_rapo_episode_with_retrieval(policy_tokenizer_dir, session_id):
    import asyncio

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from rapo_agents.integrations.verl.agent_loop import RapoEnvAgentLoop
    from rapo_agents.policies import ScriptedPolicy
    from rapo_buffers.candidates import Candidate, StaticRetriever

    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_dir)
    turns = ["<python>\nprint(6 * 7)\n</python>", "<answer>\\boxed{42}</answer>"]
    trace = "<python>\nprint(1)\n</python> <result>\n1\n</result>"
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 512, "prompt_length": 1024}},
                               "data": {}})
    server = ScriptedServer(ScriptedPolicy(turns, tokenizer=tokenizer))
    loop = RapoEnvAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer, processor=None,
        dataset_cls=None, data_config=DictConfigWrap(config.data), name="rapo_env_agent",
        env_kwargs={"num_tasks": 4, "sandbox": "subprocess"},
        retrieval={"retriever": StaticRetriever([Candidate(trace, 1.0, 0.9)]), "retrieve_prob": 1.0,
                   "no_retrieve_first_k": 1, "group_size": 2},
    )
    output = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, extra_info={"task_index": 1},
                                  session_id=session_id))
    record = output.extra_fields["rapo"]
    ids, mask = output.response_ids, output.response_mask
    assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "".join(turns)
    assert [tokenizer.decode(ids[a:b]) for a, b in record["step_spans"]] == turns
    assert all(m == 1 for a, b in record["step_spans"] for m in mask[a:b])
    assert sum(mask) == sum(b - a for a, b in record["step_spans"])
    assert all(params["stop"] and params["include_stop_str_in_output"] for params in server.requests)
    assert output.response_logprobs is not None and len(output.response_logprobs) == len(ids)
    if session_id == 0:
        assert record["retrieved_after"] == [0, 0] and record["retrieval_tokens"] == 0 and record["f_ret"] == 0.0
    else:
        observation = tokenizer.decode(ids[record["step_spans"][0][1] : record["step_spans"][1][0]])
        assert record["retrieved_after"] == [1, 0] and trace in observation
        assert record["f_ret"] == pytest.approx(record["retrieval_tokens"] / len(ids)) and record["f_ret"] > 0


def _gpu_ready() -> bool:
    return torch.cuda.is_available() and shutil.which("nvidia-smi") is not None and "RAPO_VERL_MODEL" in os.environ


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ready(), reason="needs CUDA, verl[vllm] and RAPO_VERL_MODEL (a local model path)")
def test_two_real_verl_training_steps(tmp_path):
    subprocess.run(
        [sys.executable, "scripts/verl/prepare_data.py", "--out", str(tmp_path), "--num-tasks", "64"],
        cwd=REPO_ROOT, check=True,
    )
    environment = {**os.environ, "RAPO_VERL_DATA": str(tmp_path)}
    result = subprocess.run(
        [
            "bash", "scripts/verl/run_rapo_7b.sh",
            f"actor_rollout_ref.model.path={os.environ['RAPO_VERL_MODEL']}",
            "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=4", "data.max_response_length=512", "trainer.total_training_steps=2",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.logger=[console]",
        ],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=3600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "rapo/z_ret_mean" in result.stdout
