"""Spec §5's step entropies of one turn, from its per-token statistics, by `rapo_agents.rapo`'s estimators.

`step_entropies` measures a step with both of `rapo_agents.rapo`'s estimators, whose names are the only
ones they have: `step_entropy_paper` (the mean over the step's generated tokens of the full-vocabulary
entropy) and `step_entropy_reference` (the sum over the first <= 20 tokens of the entropy of the top-10
log-probs, divided by log|V|). It turns a generation's ragged per-token lists into the tensors they take.

`turn_entropy` measures a turn's first k tokens for ARPO-style branching (`rapo_agents.rollout.branching`)
with the reference estimator, which is also ARPO's.

Example:
    >>> paper, reference = step_entropies([1.0, 3.0], [[-0.1, -2.5]], vocab_size=100)
    >>> paper, round(reference, 4)
    (2.0, 0.0642)
    >>> turn_entropy(None, [1.0, 3.0, 5.0], vocab_size=100, tokens=2)
    2.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rapo_agents.rapo import step_entropy_paper, step_entropy_reference

REFERENCE_ENTROPY_TOKENS = 20
"""The reference estimator looks at the first 20 tokens of a step."""


def with_sampled_token(
    top_logprobs: Sequence[Sequence[float]],
    sampled_logprobs: Sequence[float],
    top_token_ids: Sequence[Sequence[int]] | None = None,
    token_ids: Sequence[int] | None = None,
) -> list[list[float]]:
    """Each row of top-k log-probs, plus the sampled token's log-prob where it is not among them.

    vLLM's ``logprobs=k`` answers the top k *and* the sampled token when it is outside them, and the
    reference's step entropy sums every entry it gets. Whether the sampled token is outside is read
    from the token ids when the backend gives them, else from its log-prob being below the row's least.

    Example:
        >>> with_sampled_token([[-0.1, -2.5], [-0.2, -1.8]], [-0.1, -4.0])
        [[-0.1, -2.5], [-0.2, -1.8, -4.0]]
    """
    rows = []
    for index, row in enumerate(top_logprobs):
        row = list(row)
        if index < len(sampled_logprobs) and row:
            if top_token_ids is not None and token_ids is not None and index < len(top_token_ids):
                outside = token_ids[index] not in top_token_ids[index]
            else:
                outside = sampled_logprobs[index] < min(row)
            if outside:
                row.append(float(sampled_logprobs[index]))
        rows.append(row)
    return rows


def step_entropies(
    token_entropies: Sequence[float] | None,
    top_logprobs: Sequence[Sequence[float]] | None,
    vocab_size: int,
    max_tokens: int = REFERENCE_ENTROPY_TOKENS,
) -> tuple[float | None, float | None]:
    """One step's ``(paper, reference)`` entropies; each is None when the statistics it needs are missing.

    Args:
        token_entropies: the full-vocabulary entropy of each generated token (`step_entropy_paper`).
        top_logprobs: the top-k log-probs of each generated token, rows of any length (`step_entropy_reference`);
            `with_sampled_token` adds the sampled token where it is outside them, as the reference counts it.
        vocab_size: ``|V|`` of the policy's tokenizer.
        max_tokens: how many leading tokens the reference estimator sums.
    """
    paper = reference = None
    if token_entropies:
        values = torch.tensor(token_entropies, dtype=torch.float64)
        paper = float(step_entropy_paper(values, torch.ones_like(values)))
    if top_logprobs:
        width = max(len(row) for row in top_logprobs) or 1
        padded = torch.full((len(top_logprobs), width), -math.inf, dtype=torch.float64)  # -inf adds nothing
        for index, row in enumerate(top_logprobs):
            padded[index, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask = torch.ones(len(top_logprobs))
        reference = float(step_entropy_reference(padded, mask, vocab_size, max_tokens=max_tokens, topk=width))
    return paper, reference


def turn_entropy(
    top_logprobs: Sequence[Sequence[float]] | None,
    token_entropies: Sequence[float] | None,
    vocab_size: int,
    tokens: int,
) -> float | None:
    """Entropy of a turn's first ``tokens`` tokens: the reference estimator on their top log-probs, else the
    mean of their full-vocabulary entropies (backends without top log-probs); None when there are neither."""
    paper, reference = step_entropies(
        token_entropies[:tokens] if token_entropies else None,
        top_logprobs[:tokens] if top_logprobs else None,
        vocab_size,
        max_tokens=tokens,
    )
    return reference if reference is not None else paper
