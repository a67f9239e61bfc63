"""What rapo's verl agent loop records per trajectory, and how the trainer turns it into ``Z_ret`` and ``F_ret``.

verl carries an agent loop's ``extra_fields`` through its data protocol (``DataProto.non_tensor_batch``,
or TransferQueue fields in the v1 trainer). The rapo agent loop puts :data:`EXTRA_FIELD` there,
a dict with

- ``step_spans``: ``[(start, end), ...]`` token span of each policy step inside the response;
- ``retrieved_after``: ``[0/1, ...]`` per step: 1 when a retrieval was spliced into the observation after it;
- ``retrieval_tokens``: number of spliced retrieval tokens (all masked out of the loss);
- ``f_ret``: ``retrieval_tokens / response tokens`` (spec §7).

The loss mask itself travels as verl's ``response_mask`` (1 on policy tokens; 0 on tool results
and retrieval). The trainer adds the actor's per-token entropies (verl computes them with the
old log-probs) to get the paper's step entropies and ``Z_ret`` (spec §5).

Example:
    >>> import math, torch
    >>> fields = [{"step_spans": [(0, 2), (4, 6)], "retrieved_after": [1, 0], "retrieval_tokens": 2, "f_ret": 1 / 3}]
    >>> entropy = torch.tensor([[2.0, 2.0, 0.0, 0.0, 1.0, 1.0]])
    >>> z_ret, f_ret = retrieval_terms_from_fields(entropy, fields)
    >>> round(z_ret.item(), 4) == round(math.tanh(1.0) * 2.0, 4), round(f_ret.item(), 4)
    (True, 0.3333)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rapo_agents.rapo import EPS, retrieval_entropy_pairs, retrieval_reward, step_entropy_paper

EXTRA_FIELD = "rapo"
"""Key of rapo's per-trajectory record inside verl's ``extra_fields``."""

FIDELITIES = ("paper", "reference")


def check_fidelity(fidelity: str) -> str:
    """``fidelity`` when it is ``"paper"`` or ``"reference"``; else a ValueError that says so."""
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be 'paper' or 'reference', got {fidelity!r}")
    return fidelity


def retrieval_settings(retrieval: Mapping[str, Any], fidelity: str) -> dict[str, Any]:
    """The retrieval wrapper's keyword arguments under ``fidelity`` (``docs/fidelity.md``).

    ``select`` and ``hybrid_rule`` follow the fidelity when absent or ``"auto"``: the paper's most
    similar candidate and ``index >= k`` split, or the reference's highest-reward candidate,
    ``index > k`` split and fallback splice. A value given explicitly is kept.

    Example:
        >>> retrieval_settings({"topk": 3}, "reference")
        {'topk': 3, 'select': 'max_reward', 'hybrid_rule': 'reference'}
        >>> retrieval_settings({"select": "auto"}, "paper")
        {'select': 'most_similar', 'hybrid_rule': 'paper'}
    """
    check_fidelity(fidelity)
    settings = dict(retrieval)
    if settings.get("select", "auto") == "auto":
        settings["select"] = "most_similar" if fidelity == "paper" else "max_reward"
    if settings.get("hybrid_rule", "auto") == "auto":
        settings["hybrid_rule"] = fidelity
    return settings


def episode_fields(
    step_spans: Sequence[tuple[int, int]], retrieved_after: Sequence[int], retrieval_tokens: int, response_tokens: int,
    fidelity: str = "paper",
) -> dict[str, Any]:
    """The record the agent loop stores under :data:`EXTRA_FIELD` (plain Python values, so it pickles anywhere).

    ``fidelity`` is the agent loop's, so that the trainer can refuse a run whose two halves disagree.

    Raises:
        ValueError: when spans and marks disagree in length or a span is malformed.
    """
    if len(step_spans) != len(retrieved_after):
        raise ValueError(f"{len(step_spans)} step spans but {len(retrieved_after)} retrieval marks")
    for start, end in step_spans:
        if not 0 <= start <= end <= response_tokens:
            raise ValueError(f"step span ({start}, {end}) lies outside a response of {response_tokens} tokens")
    return {
        "step_spans": [(int(start), int(end)) for start, end in step_spans],
        "retrieved_after": [int(bool(mark)) for mark in retrieved_after],
        "retrieval_tokens": int(retrieval_tokens),
        "f_ret": float(retrieval_tokens) / max(1, response_tokens),
        "fidelity": check_fidelity(fidelity),
    }


def retrieval_terms_from_fields(
    token_entropy: torch.Tensor, fields: Sequence[dict[str, Any] | None], eps: float = EPS, fidelity: str = "paper",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Z_ret, F_ret)`` per row from the actor's response-token entropies and the agent loop's records.

    Args:
        token_entropy: ``(bs, response_length)`` full-vocabulary entropy at each response token.
        fields: per row, the :data:`EXTRA_FIELD` record (None for rows from another agent loop: 0, 0).
        eps: added to ``H_pre`` in the relative entropy drop.
        fidelity: the trainer's ``rapo.fidelity``; every record must come from an agent loop of the same.

    Returns:
        ``Z_ret`` and ``F_ret``, each ``(bs,)`` in the entropy's dtype.

    Raises:
        ValueError: a malformed entropy tensor, or a record whose agent loop ran under another fidelity.
    """
    if token_entropy.dim() != 2 or token_entropy.shape[0] != len(fields):
        raise ValueError(f"token_entropy must be (bs, T) with bs = {len(fields)}, got {tuple(token_entropy.shape)}")
    check_fidelity(fidelity)
    for record in fields:
        if record and record.get("fidelity", "paper") != fidelity:
            raise ValueError(
                f"the agent loop ran with fidelity={record.get('fidelity', 'paper')!r} but the trainer has "
                f"rapo.fidelity={fidelity!r}: set the same in the agent-loop config (its `fidelity:` key, e.g. "
                "configs/verl_agent_loops_reference.yaml) and in the run config (`rapo.fidelity`)")
    rows, width = token_entropy.shape
    num_steps = max((len(f["step_spans"]) for f in fields if f), default=0) or 1
    token_in_step = torch.zeros(rows, num_steps, width, dtype=torch.bool, device=token_entropy.device)
    step_mask = torch.zeros(rows, num_steps, dtype=torch.bool, device=token_entropy.device)
    marks = torch.zeros(rows, num_steps, dtype=torch.bool, device=token_entropy.device)
    f_ret = torch.zeros(rows, dtype=token_entropy.dtype, device=token_entropy.device)
    for row, record in enumerate(fields):
        if not record:
            continue
        f_ret[row] = float(record["f_ret"])
        for step, ((start, end), mark) in enumerate(zip(record["step_spans"], record["retrieved_after"], strict=True)):
            end = min(end, width)  # verl cuts responses at response_length
            if end > start:
                token_in_step[row, step, start:end] = True
                step_mask[row, step] = True
            marks[row, step] = bool(mark)
    step_entropies = step_entropy_paper(token_entropy.unsqueeze(1).expand(rows, num_steps, width), token_in_step)
    h_pre, h_post, valid = retrieval_entropy_pairs(step_entropies, step_mask, marks)
    return retrieval_reward(h_pre, h_post, valid, eps), f_ret


def shaping_factor(f_ret: torch.Tensor, response_mask: torch.Tensor, shaping_weight: float) -> torch.Tensor:
    """``1 + m * F_ret`` per response token (0 off the mask): what the rapo loss reads from ``rollout_is_weights``.

    Example:
        >>> shaping_factor(torch.tensor([0.5]), torch.tensor([[1, 1, 0]]), 0.1)
        tensor([[1.0500, 1.0500, 0.0000]])
    """
    return (1.0 + shaping_weight * f_ret.float()).unsqueeze(-1) * response_mask.float()

