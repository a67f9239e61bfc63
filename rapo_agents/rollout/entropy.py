"""Step entropies of spec §5 from one turn's per-token statistics.

- paper: the mean over the step's generated tokens of the full-vocabulary entropy;
- reference: the sum over the first <= 20 tokens of the entropy of the top-10 log-probs,
  divided by log|V|.

Example:
    >>> paper_step_entropy([1.0, 3.0])
    2.0
    >>> round(reference_step_entropy([[-0.1, -2.5]], vocab_size=100), 4)
    0.0642
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rapo_agents.policies.base import top_k_entropy

REFERENCE_ENTROPY_TOKENS = 20
"""The reference estimator looks at the first 20 tokens of a step."""


def paper_step_entropy(token_entropies: Sequence[float] | None) -> float | None:
    """Mean full-vocabulary entropy of a step's tokens; None when there are none."""
    if not token_entropies:
        return None
    return float(sum(token_entropies) / len(token_entropies))


def reference_step_entropy(
    top_logprobs: Sequence[Sequence[float]] | None, vocab_size: int, max_tokens: int = REFERENCE_ENTROPY_TOKENS
) -> float | None:
    """Sum over the first ``max_tokens`` tokens of the top-k entropy, divided by ``log(vocab_size)``."""
    if not top_logprobs:
        return None
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return float(sum(top_k_entropy(row) for row in top_logprobs[:max_tokens]) / math.log(vocab_size))
