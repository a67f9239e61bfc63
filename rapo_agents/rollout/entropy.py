"""Step entropies of spec §5 from one turn's per-token statistics, through `rapo_agents.rapo`.

- paper: the mean over the step's generated tokens of the full-vocabulary entropy;
- reference: the sum over the first <= 20 tokens of the entropy of the top-10 log-probs,
  divided by log|V|.

`turn_entropy` measures a turn's first k tokens for ARPO-style branching (`rapo_agents.rollout.branching`)
with the reference estimator, which is also ARPO's.

Example:
    >>> paper_step_entropy([1.0, 3.0])
    2.0
    >>> round(reference_step_entropy([[-0.1, -2.5]], vocab_size=100), 4)
    0.0642
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


def paper_step_entropy(token_entropies: Sequence[float] | None) -> float | None:
    """Mean full-vocabulary entropy of a step's tokens; None when there are none."""
    if not token_entropies:
        return None
    values = torch.tensor(token_entropies, dtype=torch.float64)
    return float(step_entropy_paper(values, torch.ones_like(values)))


def reference_step_entropy(
    top_logprobs: Sequence[Sequence[float]] | None, vocab_size: int, max_tokens: int = REFERENCE_ENTROPY_TOKENS
) -> float | None:
    """Sum over the first ``max_tokens`` tokens of the top-k entropy, divided by ``log(vocab_size)``."""
    if not top_logprobs:
        return None
    width = max(len(row) for row in top_logprobs) or 1
    padded = torch.full((len(top_logprobs), width), -math.inf, dtype=torch.float64)  # -inf adds nothing
    for index, row in enumerate(top_logprobs):
        padded[index, : len(row)] = torch.tensor(row, dtype=torch.float64)
    mask = torch.ones(len(top_logprobs))
    return float(step_entropy_reference(padded, mask, vocab_size, max_tokens=max_tokens, topk=width))


def turn_entropy(
    top_logprobs: Sequence[Sequence[float]] | None,
    token_entropies: Sequence[float] | None,
    vocab_size: int,
    tokens: int,
) -> float | None:
    """Entropy of a turn's first ``tokens`` tokens: the reference estimator on their top log-probs, else the
    mean of their full-vocabulary entropies (backends without top log-probs); None when there are neither."""
    if top_logprobs:
        return reference_step_entropy(top_logprobs[:tokens], vocab_size, max_tokens=tokens)
    return paper_step_entropy(token_entropies[:tokens] if token_entropies else None)
