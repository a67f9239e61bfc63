"""The mechanism metrics of a step say what the splices did to the advantages of the policy's own rollouts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rapo_agents.batch import TrainBatch
from rapo_agents.rapo import rapo_advantages
from rapo_agents.step_metrics import rollout_metrics


def step(rewards, spliced, correct):
    """One group of rollouts: rewards, which got a splice, which answered right (advantages as RAPO's)."""
    n = len(rewards)
    rewards = torch.tensor(rewards, dtype=torch.float32)
    zeros = torch.zeros(n)
    batch = TrainBatch(
        input_ids=torch.zeros(n, 4, dtype=torch.long), attention_mask=torch.ones(n, 4, dtype=torch.long),
        loss_mask=torch.ones(n, 4), old_logprobs=torch.zeros(n, 4),
        advantages=rapo_advantages(rewards, zeros, torch.zeros(n, dtype=torch.long)),
        f_ret=zeros, rewards=rewards, z_ret=zeros, retrievals=torch.tensor(spliced, dtype=torch.long),
        entropy_pre=torch.full((n,), torch.nan), entropy_post=torch.full((n,), torch.nan),
        prompt_lengths=torch.ones(n, dtype=torch.long))
    trajectories = [SimpleNamespace(metrics={"accuracy": float(c)}, num_tool_calls=1, end_reason="answer",
                                    rollout_index=i) for i, c in enumerate(correct)]
    return rollout_metrics(trajectories, batch, hybrid_from=2)


def test_splices_that_score_higher_push_the_policys_own_rollouts_below_the_group_mean():
    metrics = step(rewards=[1.0, 0.0, 1.0, 1.0], spliced=[0, 0, 1, 1], correct=[1, 0, 1, 1])
    assert metrics["mechanism/spliced_advantage"] > 0 > metrics["mechanism/unspliced_advantage"]
    without = step(rewards=[1.0, 0.0, 0.0, 0.0], spliced=[0, 0, 0, 0], correct=[1, 0, 0, 0])
    # The same correct on-policy rollout is told less when its group's splices succeed too.
    assert metrics["mechanism/correct_unspliced_advantage"] < without["mechanism/correct_unspliced_advantage"]
    assert metrics["retrieval/hybrid_splice_rate"] == 1.0


def test_without_splices_the_spliced_figures_are_missing_not_zero():
    metrics = step(rewards=[1.0, 0.0], spliced=[0, 0], correct=[1, 0])
    assert torch.isnan(torch.tensor(metrics["mechanism/spliced_advantage"]))
    assert metrics["mechanism/unspliced_advantage"] == pytest.approx(0.0, abs=1e-6)


def test_a_step_reports_what_its_rollouts_prefilled_and_reused_and_nothing_without_a_prefix_cache(tiny_policy):
    from rapo_agents.policies import ByteTokenizer, FastPolicy
    from rapo_agents.policies.base import SamplingParams
    from rapo_agents.step_metrics import prefill_metrics, prefill_snapshot

    assert prefill_snapshot(tiny_policy) is None and prefill_metrics(None, None) == {}  # HFPolicy keeps no cache
    policy = FastPolicy(tiny_policy.model, ByteTokenizer(), weight_format="fp32")
    context = ByteTokenizer().encode("a shared system prompt, then the question")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    policy.generate([context], greedy)
    before = prefill_snapshot(policy)
    policy.generate([context + [65, 66]], greedy)  # the next turn: the same context and two new tokens
    step = prefill_metrics(before, prefill_snapshot(policy))
    assert 0 < step["rollout/prefill_tokens"] < len(context)
    assert step["rollout/prefix_reused_fraction"] > 0.5
