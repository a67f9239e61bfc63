"""Ray rollouts on a real local cluster match the local engine's trajectories under the same seeds.

The step-trace service runs as a Ray Serve deployment, and every env (local and in the workers)
reaches it over HTTP by URL, as it would reach a plain ``rapo buffer serve`` server.
"""

from __future__ import annotations

import dataclasses
import functools
import socket

import pytest

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")

from rapo_agents.backends import make_engine  # noqa: E402
from rapo_agents.config import RayConfig  # noqa: E402
from rapo_agents.integrations.ray_rollout import PolicyActor, RayRolloutEngine, serve_retrieval  # noqa: E402
from rapo_agents.policies import ScriptedPolicy  # noqa: E402
from rapo_agents.rollout import RolloutConfig  # noqa: E402
from rapo_agents.rollout.branching import ARPOConfig  # noqa: E402
from rapo_buffers.candidates import Candidate, StaticRetriever  # noqa: E402
from rapo_env.wrappers import StepTraceRetrievalWrapper  # noqa: E402

ENV_KWARGS = {"num_tasks": 6, "sandbox": "subprocess"}
TURNS = [
    "<think>Compute it.</think>\n<python>\nprint(6 * 7)\n</python>",
    "<think>Check.</think>\n<python>\nprint(6 * 7 + 0)\n</python>",
    "<answer>\\boxed{42}</answer>",
]
TRACE = "<think>Multiply first.</think>\n<python>\nprint(3 * 14)\n</python> <result>\n42\n</result>"


def retrieval_wrapper(url: str):
    """Hybrid rollouts from index 1 on, spliced with probability 0.5: draws that a seed must fix."""
    return functools.partial(
        StepTraceRetrievalWrapper, retriever=url, retrieve_prob=0.5, no_retrieve_first_k=1, group_size=3, seed=5
    )


def comparable(trajectory):
    record = dataclasses.asdict(trajectory)
    record.pop("source")  # the policy's name: RemotePolicy behind an actor
    return record


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def retrieval_url(ray_cluster):
    from ray import serve

    url = serve_retrieval(lambda: StaticRetriever([Candidate(TRACE, reward=1.0, score=0.9)]), http_port=free_port())
    yield url
    serve.shutdown()


@pytest.fixture(scope="module")
def local_trajectories(retrieval_url):
    config = RolloutConfig(rollout_n=3)
    with make_engine("RAPO-Math-v0", ScriptedPolicy(TURNS), config, ENV_KWARGS,
                     [retrieval_wrapper(retrieval_url)]) as engine:
        return engine.run([4, 0, 3], seed=11)


def test_ray_workers_reproduce_the_local_trajectories(retrieval_url, local_trajectories):
    """Two rollout actors share one PolicyActor; the envs in the actors retrieve from the Serve deployment."""
    policy_actor = ray.remote(PolicyActor).options(num_cpus=0).remote(functools.partial(ScriptedPolicy, TURNS))
    streamed = []
    with make_engine("RAPO-Math-v0", policy_actor, RolloutConfig(backend="ray", rollout_n=3), ENV_KWARGS,
                     [retrieval_wrapper(retrieval_url)], ray=RayConfig(num_workers=2)) as engine:
        trajectories = engine.run([4, 0, 3], seed=11, on_trajectory=streamed.append)
        stats = engine.stats
    assert [comparable(t) for t in trajectories] == [comparable(t) for t in local_trajectories]
    assert {t.source for t in trajectories} == {"RemotePolicy"}
    assert sorted((t.extra["group_index"], t.rollout_index) for t in streamed) == [
        (g, i) for g in range(3) for i in range(3)
    ]
    spliced = [step for t in trajectories for step in t.steps if step.retrieval]
    assert spliced and all(TRACE in step.retrieval["text"] for step in spliced)  # served by Ray Serve
    assert all(t.extra["retrieval_tokens"] == 0 for t in trajectories if t.rollout_index == 0)
    assert stats.episodes == 9 and stats.tool_calls == sum(t.num_tool_calls for t in trajectories)


def test_ray_workers_reproduce_arpo_branched_groups(ray_cluster):
    """Branching groups (every tool result branches: tau = 1) come back whole and as the local engine plays them."""
    config, arpo = RolloutConfig(rollout_n=3), ARPOConfig(initial_rollouts=1, branch_probability=1.0)
    with make_engine("RAPO-Math-v0", ScriptedPolicy(TURNS), config, ENV_KWARGS, arpo=arpo) as engine:
        local = engine.run([1, 5, 2], seed=2)
    with make_engine("RAPO-Math-v0", ScriptedPolicy(TURNS), dataclasses.replace(config, backend="ray"), ENV_KWARGS,
                     arpo=arpo, ray=RayConfig(num_workers=2)) as engine:
        remote = engine.run([1, 5, 2], seed=2)
        stats = engine.stats
    assert [comparable(t) for t in remote] == [comparable(t) for t in local]
    assert [t.extra.get("branch_parent") for t in remote] == [None, 0, 0] * 3
    assert stats.branches == 6 and stats.refills == 0 and stats.episodes == 9


def test_bad_settings_fail_clearly(ray_cluster):
    with pytest.raises(ValueError, match="backend"):
        RolloutConfig(backend="spark")
    with pytest.raises(ValueError, match="num_workers"):
        RayRolloutEngine("RAPO-Math-v0", ScriptedPolicy(TURNS), num_workers=0)


@pytest.mark.parametrize("placement", ["workers", "actor"])
def test_rapo_train_rolls_out_on_ray_workers_with_the_current_weights(ray_cluster, tiny_policy, tmp_path, placement):
    """``rollout.backend=ray`` is the only change: two workers generate with replicas of the trained model
    (or through one shared policy actor)."""
    import copy
    import json

    import torch

    from rapo_agents.config import load_config
    from rapo_agents.trainer import RAPOTrainer

    config = load_config(None, [
        "rollout.backend=ray", "ray.num_workers=2", f"ray.policy_placement={placement}", "num_tasks=4",
        "train_batch_size=2", "ppo_mini_batch_size=2",
        "rollout_n=2", "max_response_tokens=48", "max_turn_tokens=16", "lr=1e-2", "total_steps=2", "sft_steps=0",
        # A random model earns no reward variance; the entropy term makes every step update the weights.
        "entropy_coef=0.01", "retrieval.enabled=false", "env_kwargs={sandbox: subprocess, system_prompt: Use python.}",
        "logging.progress=false", "logging.tensorboard=false", "logging.plot=false", f"output_dir={tmp_path}",
    ])
    trainer = RAPOTrainer(config, model=copy.deepcopy(tiny_policy.model), tokenizer=tiny_policy.tokenizer)
    initial = torch.nn.utils.parameters_to_vector(trainer.model.parameters()).detach().clone()
    result = trainer.train()
    assert result.steps == 2 and trainer._engine is None  # the workers are released at the end
    assert not torch.equal(torch.nn.utils.parameters_to_vector(trainer.model.parameters()), initial)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["optim/steps"] == 1 for r in records)
    # Step 2's rollouts came from the weights step 1 produced: the update's first ratio is 1 (no staleness).
    assert all(abs(r["loss/approx_kl"]) < 1e-4 and r["loss/clip_fraction"] == 0.0 for r in records)
    trajectories = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    source = "hf:LlamaForCausalLM" if placement == "workers" else "RemotePolicy"
    assert len(trajectories) == 2 * 2 * 2 and {t["source"] for t in trajectories} == {source}
