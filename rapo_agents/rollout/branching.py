"""ARPO's entropy-based adaptive rollout (Dong et al. 2025, "Agentic Reinforced Policy Optimization").

A group of G = ``rollout_n`` rollouts of one question starts with only M = ``initial_rollouts`` of them.
After each tool result, the policy's next turn is generated; the entropy ``H_t`` of its first k tokens
(ARPO's estimator: the top-k log-prob entropy summed over those tokens, over log|V|) is compared with
``H_initial``, that of the rollout's first turn. Each of the ``beam_size - 1`` possible branches then
happens when

    u ~ U(0, 1),   p = clip(u - entropy_weight * (H_t - H_initial), 0, 1),   p <= branch_probability

so that a rise in entropy after a tool result makes branching likelier (with ``entropy_weight = 0`` it is
a coin with probability ``branch_probability``). A branch is a new rollout of the group that continues
from the tool result, sharing the prefix, and samples that turn afresh; the group stops branching once
it holds G rollouts, and rollouts that end before their share of the group is used are followed by
fresh ones from the prompt, so every group has exactly G trajectories.

Which slots of the group a rollout may fill with branches is fixed up front (its *reserve*), so the
result does not depend on the order in which concurrent episodes reach their tool results.

Example:
    >>> initial_reserves(group_size=8, initial_rollouts=3)
    [[3, 6], [4, 7], [5]]
    >>> split_reserve([3, 6, 9, 12], branches=1)
    ([6, 12], [(3, [9])])
    >>> branch_count(delta_h=0.0, draws=[0.3, 0.7], entropy_weight=0.2, branch_probability=0.5)
    1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass
class ARPOConfig:
    """ARPO-style adaptive rollout; off by default. Knob names are those of ARPO's reference scripts."""

    initial_rollouts: int | None = None
    """M: rollouts started from the prompt per question; the rest of ``rollout_n`` come from branching
    (the reference: 8 of 16). None: off, every rollout starts from the prompt."""
    beam_size: int = 2
    """A rollout may branch into ``beam_size - 1`` new rollouts after each tool result (the reference: 2)."""
    branch_probability: float = 0.5
    """tau: a branch happens when ``u - entropy_weight * dH <= branch_probability`` (u uniform in [0, 1])."""
    entropy_weight: float = 0.2
    """How much a rise of the entropy after a tool result over the first turn's raises the branching
    probability (the reference: 0.2)."""
    entropy_tokens: int = 20
    """k: the entropy of a turn is measured on its first k tokens (the reference: 20)."""

    def __post_init__(self) -> None:
        if self.initial_rollouts is not None and self.initial_rollouts < 1:
            raise ValueError(f"initial_rollouts must be >= 1 or None, got {self.initial_rollouts}")
        if self.beam_size < 1 or self.entropy_tokens < 1:
            raise ValueError(f"beam_size and entropy_tokens must be >= 1, got {self.beam_size}, {self.entropy_tokens}")
        if not 0.0 <= self.branch_probability <= 1.0:
            raise ValueError(f"branch_probability must be in [0, 1], got {self.branch_probability}")

    def enabled(self, group_size: int) -> bool:
        """Whether groups of ``group_size`` branch at all.

        Raises:
            ValueError: when ``initial_rollouts`` exceeds the group size.
        """
        if self.initial_rollouts is None:
            return False
        if self.initial_rollouts > group_size:
            raise ValueError(f"initial_rollouts ({self.initial_rollouts}) exceeds the group size ({group_size})")
        return self.initial_rollouts < group_size and self.beam_size > 1


def initial_reserves(group_size: int, initial_rollouts: int) -> list[list[int]]:
    """The slots (rollout indices) each initial rollout ``0..M-1`` may fill: ``M..G-1`` dealt round-robin."""
    return [list(range(group_size))[first::initial_rollouts] for first in range(initial_rollouts, 2 * initial_rollouts)]


def split_reserve(reserve: Sequence[int], branches: int) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """Give ``branches`` new rollouts the first slots of ``reserve`` and deal the rest between the parent and them.

    Returns the parent's remaining reserve and, per branch, its rollout index and reserve.
    """
    branches = min(branches, len(reserve))
    rest = list(reserve[branches:])
    shares = [rest[offset:: branches + 1] for offset in range(branches + 1)]
    return shares[0], [(reserve[index], shares[index + 1]) for index in range(branches)]


def branch_count(delta_h: float, draws: Sequence[float], entropy_weight: float, branch_probability: float) -> int:
    """How many of the candidate branches happen: those with ``clip(u - entropy_weight * dH, 0, 1) <= tau``."""
    return sum(min(1.0, max(0.0, u - entropy_weight * delta_h)) <= branch_probability for u in draws)
