"""verl's ``algorithm.norm_adv_by_std_in_grpo`` reaches rapo's estimator (false: Dr.GRPO, only centred)."""

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed")

from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

import rapo_agents.integrations.verl  # noqa: E402,F401  (registers rapo with verl)

REWARDS = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2])
INDEX = np.array(["q1", "q1", "q1", "q2", "q2", "q3"], dtype=object)
MASK = torch.ones(6, 4)


def token_rewards() -> torch.Tensor:
    rewards = torch.zeros(6, 4)
    rewards[:, -1] = REWARDS
    return rewards


@pytest.mark.parametrize("norm", [True, False])
def test_without_retrieval_it_is_verls_grpo_with_the_same_flag(norm):
    ours, _ = core_algos.get_adv_estimator_fn("rapo")(
        token_level_rewards=token_rewards(), response_mask=MASK, index=INDEX,
        config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
    grpo, _ = core_algos.compute_grpo_outcome_advantage(token_rewards(), MASK, INDEX, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(ours, grpo)


def test_dr_grpo_centres_the_retrieval_advantage_too():
    z_ret = torch.tensor([0.0, 0.6, 0.0, 0.0, 0.2, 0.0])
    ours, _ = core_algos.get_adv_estimator_fn("rapo")(
        token_level_rewards=token_rewards(), response_mask=MASK, index=INDEX, retrieval_reward=z_ret,
        norm_adv_by_std_in_grpo=False)
    # q1: A_acc = R - 0.5, A_ret = Z - 0.2; q2: A_acc = R - 0.5, A_ret = Z - 0.1; q3 alone: mean 0
    expected = torch.tensor([0.5 * 0.96, -0.5 * 1.08, 0.0, 0.5 * 0.98, -0.5 * 1.02, 0.2])
    torch.testing.assert_close(ours[:, 0], expected)
