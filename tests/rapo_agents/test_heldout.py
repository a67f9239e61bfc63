"""Held-out evaluation: what it decodes with, and that it gives the training policy back as it was."""

from __future__ import annotations

import pytest

from rapo_agents.heldout import HeldoutConfig, HeldoutEvaluator
from rapo_agents.policies import ScriptedPolicy
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


@pytest.mark.parametrize("settings", [{"max_batch_size": 0}, {"threads": 0}])
def test_evaluation_settings_are_checked_at_load(settings):
    with pytest.raises(ValueError, match="max_batch_size|threads"):
        HeldoutConfig(**settings)
