"""One step's entropies from a generation's ragged per-token lists equal `rapo_agents.rapo`'s on padded tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rapo_agents.rapo import step_entropy_paper, step_entropy_reference
from rapo_agents.rollout.entropy import step_entropies, turn_entropy


def test_step_entropies_match_the_tensor_estimators_on_ragged_top_logprobs():
    rows = [[-0.1, -2.5, -4.0], [-0.7], [-0.3, -1.4]]  # a backend may return fewer than k candidates
    paper, reference = step_entropies([1.0, 2.0, 4.0], rows, vocab_size=50, max_tokens=2)
    padded = torch.tensor([[-0.1, -2.5, -4.0], [-0.7, -math.inf, -math.inf], [-0.3, -1.4, -math.inf]])
    assert paper == pytest.approx(step_entropy_paper(torch.tensor([1.0, 2.0, 4.0]), torch.ones(3)).item())
    expected = step_entropy_reference(padded, torch.ones(3), vocab_size=50, max_tokens=2, topk=3).item()
    assert reference == pytest.approx(expected)


def test_missing_statistics_give_none_for_that_estimator_only():
    assert step_entropies(None, None, vocab_size=10) == (None, None)
    paper, reference = step_entropies([], [[-0.5]], vocab_size=10)
    assert paper is None and reference > 0


def test_turn_entropy_prefers_the_reference_estimator_over_the_first_tokens():
    rows = [[math.log(0.5), math.log(0.5)]] * 3
    assert turn_entropy(rows, [9.0, 9.0, 9.0], vocab_size=4, tokens=2) == pytest.approx(2 * math.log(2) / math.log(4))
    assert turn_entropy(None, [1.0, 3.0, 9.0], vocab_size=4, tokens=2) == 2.0


def test_the_reference_estimator_counts_a_sampled_token_outside_the_top_k():
    """vLLM answers the top 10 plus the sampled token when it is not among them, and the reference's
    step entropy sums every entry, so a step that sampled an unlikely token has a larger entropy."""
    from rapo_agents.policies.base import Generation
    from rapo_agents.rollout.episode import reference_rows
    from rapo_agents.rollout.entropy import step_entropies

    top = [[math.log(0.5), math.log(0.3)]]
    unlikely = Generation(token_ids=[7], text="x", finish_reason="stop", logprobs=[math.log(0.01)],
                          top_logprobs=top, top_token_ids=[[1, 2]])
    likely = Generation(token_ids=[1], text="x", finish_reason="stop", logprobs=[math.log(0.5)],
                        top_logprobs=top, top_token_ids=[[1, 2]])
    assert reference_rows(unlikely, 1) == [top[0] + [math.log(0.01)]]
    assert reference_rows(likely, 1) == top
    _, counted = step_entropies(None, reference_rows(unlikely, 1), vocab_size=100)
    _, top_only = step_entropies(None, top, vocab_size=100)
    assert counted == pytest.approx(top_only - 0.01 * math.log(0.01) / math.log(100))
