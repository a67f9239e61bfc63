"""Held-out evaluation: what it decodes with (fp32 over the trained module, whatever the rollouts sample with), and
that it gives the training policy back as it was."""

from __future__ import annotations

import pytest

from rapo_agents.heldout import HeldoutConfig, HeldoutEvaluator
from rapo_agents.policies import ScriptedPolicy
from rapo_agents.policies.fast import FastPolicy
from rapo_agents.rollout.config import RolloutConfig


class RecordingPolicy(ScriptedPolicy):
    """A scripted solver with the CPU policies' decoding attributes, recording them at every generate call."""

    def __init__(self, turns):
        super().__init__(turns)
        self.max_batch_size, self.threads = 32, 1
        self.seen: list[tuple[int, int | None, int]] = []

    def generate(self, contexts, sampling):
        self.seen.append((self.max_batch_size, self.threads, len(contexts)))
        return super().generate(contexts, sampling)


def test_an_evaluation_decodes_with_its_own_batch_and_threads_and_restores_the_policys():
    policy = RecordingPolicy(["<python>\nprint(1)\n</python>", "<answer>\\boxed{1}</answer>"])
    rollout = RolloutConfig(max_concurrent_episodes=2, max_response_tokens=128)
    evaluator = HeldoutEvaluator("RAPO-Math-v0", {"dataset": "procedural", "num_tasks": 8, "sandbox": "subprocess"},
                                 policy, rollout, HeldoutConfig(heldout_tasks=6, max_batch_size=6, threads=2))
    try:
        result = evaluator.evaluate(0, show_progress=False)
    finally:
        evaluator.close()
    assert len(result.correct) == 6
    assert {(batch, threads) for batch, threads, _ in policy.seen} == {(6, 2)}
    # More episodes in flight than the training rollouts' 2: the first turns of all six questions decode together.
    assert max(rows for _, _, rows in policy.seen) == 6
    assert (policy.max_batch_size, policy.threads) == (32, 1)


def greedy_responses(evaluator: HeldoutEvaluator) -> list[str]:
    try:
        return [trajectory.response for trajectory in evaluator.engine.run([0, 1, 2], seed=0)]
    finally:
        evaluator.close()


def test_the_evaluation_decodes_the_trained_module_in_fp32_while_rollouts_sample_int8(tiny_policy):
    rollouts = FastPolicy(tiny_policy.model, tiny_policy.tokenizer, weight_format="int8")
    env_kwargs = {"dataset": "procedural", "num_tasks": 8, "sandbox": "subprocess"}
    rollout = RolloutConfig(max_response_tokens=24, max_turn_tokens=24)

    def evaluator(policy, **settings):
        return HeldoutEvaluator("RAPO-Math-v0", env_kwargs, policy, rollout, HeldoutConfig(heldout_tasks=3, **settings))

    exact = evaluator(rollouts)
    assert exact.engine.policy.decoder.weight_format == "fp32" and exact.engine.policy.model is rollouts.model
    assert rollouts.decoder.weight_format == "int8"
    # Exact: the answers transformers itself gives greedily for the same weights.
    assert greedy_responses(exact) == greedy_responses(evaluator(tiny_policy))
    assert evaluator(rollouts, weight_format=None).engine.policy is rollouts  # the rollout policy's own, on request


@pytest.mark.parametrize("settings", [{"max_batch_size": 0}, {"threads": 0}, {"weight_format": "int4"}])
def test_evaluation_settings_are_checked_at_load(settings):
    with pytest.raises(ValueError, match="max_batch_size|threads|weight_format"):
        HeldoutConfig(**settings)
