"""RAPO (Retrieval-Augmented Policy Optimization) as pure, batched torch functions.

The functions follow the paper's order (spec ``rapo-algorithm.md`` §5-7) and its symbols:

1. step entropies ``H(s)`` (§5): :func:`step_entropy_paper`, :func:`step_entropy_reference`;
2. retrieval reward ``Z_ret`` (§5): :func:`retrieval_entropy_pairs`, :func:`retrieval_reward`;
3. advantages (§6): :func:`group_normalize` (``A_acc`` and ``A_ret``), :func:`fused_advantage`, :func:`rapo_advantages`;
4. importance shaping and loss (§7): :func:`retrieval_fraction` (``F_ret``), :func:`rapo_policy_loss`;
5. sampler-mismatch correction (not in the spec; TRL's and verl's): :func:`rollout_correction_weights`.

Every function works on any device and dtype, takes padded batches, and never loops over tokens
in Python, so other trainers (verl, TRL, skrl) can call them as they are.

Example:
    >>> import torch
    >>> rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    >>> z_ret = torch.tensor([0.0, 0.0, 0.3, -0.1])          # rollouts 2, 3 were hybrid
    >>> group = torch.tensor([0, 0, 0, 0])
    >>> advantages = rapo_advantages(rewards, z_ret, group, advantage_weight=0.2)
    >>> advantages.shape
    torch.Size([4])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Fidelity = Literal["paper", "reference"]
LossWeighting = Literal["token_mean", "micro_batch_mean"]
RolloutCorrection = Literal["none", "tis", "mis"]
Baseline = Literal["group", "on_policy"]

#: Added to the denominators of the spec's normalisations (§5 dH, §6 std).
EPS = 1e-6


@dataclass
class RAPOConfig:
    """The settings of the RAPO objective (spec §5-8); defaults are the paper's and the reference script's.

    Example:
        >>> RAPOConfig().selection, RAPOConfig(fidelity="reference").selection
        ('most_similar', 'max_reward')
    """

    fidelity: Fidelity = "paper"
    """Which side of the documented paper/reference differences to follow: the step-entropy estimator,
    the hybrid split (``index >= k`` vs ``index > k``), the candidate selection rule and the fallback splice
    (spec §3-5). The reward, the python tool's output and the loss weighting have settings of their own
    (``docs/fidelity.md``)."""

    advantage_weight: float = 0.2
    """``a`` in ``A = A_acc * (1 + a * A_ret)`` (spec §6); 0 turns RAPO's advantage into GRPO's."""

    shaping_weight: float = 0.05
    """``m`` in the shaped ratio ``(1 + m * F_ret) * r`` (spec §7); 0 disables importance shaping."""

    clip_ratio_low: float = 0.2
    """``eps_low``: the ratio is clipped below at ``1 - eps_low``."""

    clip_ratio_high: float = 0.28
    """``eps_high``: the ratio is clipped above at ``1 + eps_high`` (asymmetric clip-higher)."""

    clip_ratio_c: float = 3.0
    """``c`` of the dual clip: for ``A < 0`` the token loss is at most ``-c * A``."""

    kl_coef: float = 0.0
    """Weight of the k3 KL penalty against a reference policy; 0 (the reference's value) skips it."""

    entropy_coef: float = 0.0
    """Weight of the entropy bonus; 0 (the reference's value) skips it."""

    eps: float = EPS
    """Added to the group std (§6) and to ``H_pre`` in the relative entropy drop (§5)."""

    norm_adv_by_std_in_grpo: bool = True
    """Divide ``R`` and ``Z_ret`` by their group std after centring them (spec §6, GRPO). False is
    Dr.GRPO, as verl's option of this name: both are only centred (the reference code does the same)."""

    loss_weighting: LossWeighting = "token_mean"
    """How the micro-batches of one optimiser step add up. ``token_mean``: the token mean over the whole
    mini-batch (spec §7), whatever the split. ``micro_batch_mean``: verl's (dynamic batch size): each
    micro-batch's own token mean, weighted by its share of the mini-batch's sequences, so a token in a
    micro-batch of short rows weighs more."""

    rollout_correction: RolloutCorrection = "none"
    """Correction for sampling from another engine than the trained module (an int8 or vLLM sampler), with the
    per-token ratio ``w = exp(logp_old - logp_sampler)`` of the trainer's recomputed ``logp_old`` to the sampler's
    log-prob, multiplying each token's policy-gradient loss (:func:`rollout_correction_weights`). ``none``: no
    weight (the loss is unchanged). ``tis``: truncated IS, ``min(w, cap)`` (TRL ``token_truncate``, verl
    ``rollout_is=token``). ``mis``: masked IS, ``w`` where ``1/cap <= w <= cap``, else 0 (verl's token-level mask).
    It only acts when ``logp_old`` is recomputed (``optim.recompute_old_logprobs``, or automatically for a policy
    with inexact log-probs); otherwise ``w = 1``."""

    rollout_correction_cap: float = 2.0
    """The cap of ``rollout_correction`` (> 1): TIS truncates ``w`` at it, MIS keeps ``w`` in ``[1/cap, cap]``.
    2.0 is the default of TRL's ``vllm_importance_sampling_cap`` and of verl's ``rollout_is_threshold``."""

    baseline: Baseline = "group"
    """Which rollouts of a group give ``A_acc`` its mean. ``group`` (the paper, spec §6): all of them.
    ``on_policy``: only those that got no splice, so that high-reward spliced rollouts do not lower the
    advantages of the policy's own (a group with fewer than 2 such rollouts uses all of them); the std is still
    the whole group's, which stays above 0 whenever the rewards differ. Not the paper's:
    an experiment of ``docs/training.md`` (multi-step math, where spliced rollouts set the group mean)."""

    spliced_loss: bool = True
    """Whether spliced (hybrid) rollouts carry loss. True (the paper): their own tokens are trained, the retrieved
    ones masked. False: they still count in their group's ``A_acc`` mean and std, but none of their tokens is
    trained. Not the paper's: a diagnostic of ``docs/training.md`` (is it learning from spliced rollouts that
    costs RAPO held-out accuracy on multi-step math?)."""

    def __post_init__(self) -> None:
        if self.fidelity not in ("paper", "reference"):
            raise ValueError(f"fidelity must be 'paper' or 'reference', got {self.fidelity!r}")
        for name in ("clip_ratio_low", "clip_ratio_high", "kl_coef", "entropy_coef", "eps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual clip), got {self.clip_ratio_c}")
        if self.loss_weighting not in ("token_mean", "micro_batch_mean"):
            raise ValueError(f"loss_weighting must be 'token_mean' or 'micro_batch_mean', got {self.loss_weighting!r}")
        if self.baseline not in ("group", "on_policy"):
            raise ValueError(f"baseline must be 'group' or 'on_policy', got {self.baseline!r}")
        if self.rollout_correction not in ("none", "tis", "mis"):
            raise ValueError(f"rollout_correction must be 'none', 'tis' or 'mis', got {self.rollout_correction!r}")
        if not (math.isfinite(self.rollout_correction_cap) and self.rollout_correction_cap > 1.0):
            raise ValueError(
                f"rollout_correction_cap must be a finite number > 1 (TIS truncates the sampler ratio at it, MIS "
                f"keeps it in [1/cap, cap]), got {self.rollout_correction_cap}")

    @property
    def entropy_estimator(self) -> Literal["paper", "reference"]:
        """Which step-entropy estimator feeds ``Z_ret``: the paper's full-vocab mean or the reference's top-k sum."""
        return self.fidelity

    @property
    def selection(self) -> Literal["most_similar", "max_reward"]:
        """The retrieval wrapper's candidate rule: paper = most similar, reference = highest reward."""
        return "most_similar" if self.fidelity == "paper" else "max_reward"

    @property
    def hybrid_rule(self) -> Literal["paper", "reference"]:
        """The retrieval wrapper's hybrid split: paper = rollouts ``index >= k`` are hybrid (8 of 16),
        reference = ``index > k`` (7 of 16), as its code tests."""
        return self.fidelity


# ----------------------------------------------------------------------------------------------
# §5 step entropies


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where a row has no valid entry.

    Example:
        >>> masked_mean(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[1, 1, 0]]), dim=-1)
        tensor([2.])
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary entropy ``-sum_j p_j log p_j`` of each position's distribution (spec §5, paper).

    Computed as ``logsumexp(z) - sum_j softmax(z)_j z_j``, which avoids ``log 0``.

    Example:
        >>> round(token_entropy_from_logits(torch.zeros(1, 4)).item(), 4) == round(math.log(4), 4)
        True
    """
    # Half-precision logits are upcast: the difference of two large terms loses too much in bf16.
    work = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    probs = torch.softmax(work, dim=-1)
    return (torch.logsumexp(work, dim=-1) - (probs * work).sum(-1)).to(logits.dtype)


def step_entropy_paper(token_entropies: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """Paper's ``H(s)`` (§5): mean over a step's generated tokens of the full-vocabulary entropy.

    Args:
        token_entropies: ``[..., L]`` per-token entropies of each step's policy tokens, padded.
        step_mask: ``[..., L]`` 1 on the step's real tokens.

    Returns:
        ``[...]`` one entropy per step (0 for an empty step).

    Example:
        >>> step_entropy_paper(torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
        tensor([1.5000, 4.0000])
    """
    return masked_mean(token_entropies, step_mask, dim=-1)


def topk_token_entropy(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """Reference per-token entropy ``-sum_{j<=k} exp(l_j) l_j`` over the top-k sampling log-probs.

    Like the reference, the top-k probabilities are *not* renormalised; ``-inf`` log-probs (a
    backend that returned fewer than k) contribute 0.

    Example:
        >>> round(topk_token_entropy(torch.log(torch.tensor([[0.5, 0.5]]))).item(), 4)
        0.6931
    """
    probs = topk_logprobs.exp()
    terms = torch.where(probs > 0, probs * topk_logprobs, torch.zeros_like(probs))
    return -terms.sum(-1)


def step_entropy_reference(
    topk_logprobs: torch.Tensor,
    step_mask: torch.Tensor,
    vocab_size: int,
    max_tokens: int = 20,
    topk: int = 10,
) -> torch.Tensor:
    """Reference ``H(s)`` (§5): sum over the first ``<= max_tokens`` tokens of the top-k entropy, / log|V|.

    Args:
        topk_logprobs: ``[..., L, K]`` the sampling log-probs of each token's top candidates (K >= 1);
            only the first ``topk`` are used.
        step_mask: ``[..., L]`` 1 on the step's real tokens (left-aligned).
        vocab_size: ``|V|`` of the policy's tokenizer.

    Example:
        >>> lp = torch.log(torch.full((1, 3, 2), 0.5))          # three tokens, two equal candidates
        >>> round(step_entropy_reference(lp, torch.tensor([[1, 1, 0]]), vocab_size=4, max_tokens=20).item(), 4)
        1.0
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    per_token = topk_token_entropy(topk_logprobs[..., :topk])
    positions = torch.cumsum(step_mask.long(), dim=-1)
    leading = (step_mask > 0) & (positions <= max_tokens)
    return (per_token * leading.to(per_token.dtype)).sum(-1) / math.log(vocab_size)


# ----------------------------------------------------------------------------------------------
# §5 retrieval reward


def retrieval_entropy_pairs(
    step_entropies: torch.Tensor, step_mask: torch.Tensor, retrieved_after: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(H_pre, H_post, valid)`` for each retrieval, from per-step entropies and retrieval marks (§5).

    A retrieval spliced into the observation that follows step ``s`` has ``H_pre = H(s)`` and
    ``H_post = H(s + 1)``, the first policy step after it.

    Args:
        step_entropies: ``[B, S]`` entropy of each policy step, padded.
        step_mask: ``[B, S]`` 1 on real steps.
        retrieved_after: ``[B, S]`` 1 where a retrieval was spliced after step ``s``.

    Returns:
        ``H_pre``, ``H_post`` and ``valid``, each ``[B, S]``. ``valid`` drops retrievals with no policy
        step after them (the episode ran out of budget); the spec's formula needs ``H_post``.

    Example:
        >>> pre, post, valid = retrieval_entropy_pairs(
        ...     torch.tensor([[2.0, 1.0, 0.5]]), torch.tensor([[1, 1, 1]]), torch.tensor([[1, 0, 1]]))
        >>> pre.tolist(), post.tolist(), valid.tolist()
        ([[2.0, 1.0, 0.5]], [[1.0, 0.5, 0.0]], [[True, False, False]])
    """
    if not (step_entropies.shape == step_mask.shape == retrieved_after.shape):
        raise ValueError(
            "step_entropies, step_mask and retrieved_after must have one shape, got "
            f"{tuple(step_entropies.shape)}, {tuple(step_mask.shape)}, {tuple(retrieved_after.shape)}"
        )
    steps = step_mask > 0
    next_entropy = torch.nn.functional.pad(step_entropies[..., 1:], (0, 1))
    next_exists = torch.nn.functional.pad(steps[..., 1:], (0, 1), value=False)
    valid = (retrieved_after > 0) & steps & next_exists
    return step_entropies, next_entropy, valid


def retrieval_reward(
    h_pre: torch.Tensor, h_post: torch.Tensor, valid: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """``Z_ret`` per rollout (§5): the mean over its retrievals of ``tanh(2 dH_k) * H_pre``.

    ``dH_k = -(H_post - H_pre) / (H_pre + eps)`` rewards a relative entropy drop (quality), and
    the factor ``H_pre`` rewards retrieving when the policy is uncertain (timing). Rollouts
    without a valid retrieval get ``Z_ret = 0``.

    Args:
        h_pre, h_post, valid: ``[B, K]`` entropies around each retrieval and its validity mask.

    Returns:
        ``[B]`` the retrieval reward of each rollout.

    Example:
        >>> z = retrieval_reward(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[True]]))
        >>> round(z.item(), 4) == round(math.tanh(1.0), 4)
        True
    """
    delta_h = -(h_post - h_pre) / (h_pre + eps)
    z_k = torch.tanh(2.0 * delta_h) * h_pre
    return masked_mean(z_k, valid, dim=-1)


# ----------------------------------------------------------------------------------------------
# §6 advantages


def group_normalize(
    values: torch.Tensor, group_index: torch.Tensor, eps: float = EPS, scale_by_std: bool = True,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(x - mean_g(x)) / (std_g(x) + eps)`` within each group ``g`` (§6), as GRPO's ``A_acc``.

    The std is the unbiased one (``n - 1``); a group of one gets mean 0 and std 1, as in verl.
    Groups may have different sizes and need not be contiguous.

    Args:
        values: ``[N]`` one value per rollout (reward ``R`` or ``Z_ret``).
        group_index: ``[N]`` integer id of each rollout's group (question).
        scale_by_std: False only centres, ``x - mean_g(x)`` (Dr.GRPO, verl's ``norm_adv_by_std_in_grpo=false``).
        reference: ``[N]`` bool, or None (all): the rollouts whose values give each group's mean (every
            rollout of the group is still normalised); a group with fewer than 2 of them uses all. The std stays
            the whole group's: a reference whose values are all equal (every unspliced rollout failed) has std 0,
            and dividing by it sent the other rollouts' advantages to ``1 / eps``.

    Example:
        >>> [round(a, 4) for a in group_normalize(torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 0, 1])).tolist()]
        [0.7071, -0.7071, 5.0]
        >>> group_normalize(torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 0, 1]), scale_by_std=False).tolist()
        [0.5, -0.5, 5.0]
        >>> spliced_first = group_normalize(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4), scale_by_std=False,
        ...                                 reference=torch.tensor([False, True, True, True]))
        >>> [round(a, 4) for a in spliced_first.tolist()]  # the mean is 1/3, over the last three only
        [0.6667, -0.3333, -0.3333, 0.6667]
    """
    if values.dim() != 1 or values.shape != group_index.shape:
        raise ValueError(
            "values and group_index must be 1-d of one length, "
            f"got {tuple(values.shape)} and {tuple(group_index.shape)}"
        )
    if reference is not None and reference.shape != values.shape:
        raise ValueError(f"reference must be [N] like values, got {tuple(reference.shape)}")
    _, dense = torch.unique(group_index, return_inverse=True)
    num_groups = int(dense.max().item()) + 1 if dense.numel() else 0

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, dense, x)

    weights = torch.ones_like(values)
    if reference is not None:
        chosen = reference.to(values.dtype)
        weights = torch.where((group_sum(chosen) >= 2)[dense], chosen, weights)
    counts = group_sum(torch.ones_like(values))
    group_means = group_sum(values) / counts
    means = group_sum(weights * values) / group_sum(weights)
    stds = torch.sqrt(group_sum((values - group_means[dense]) ** 2) / (counts - 1).clamp(min=1))
    single = counts == 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    centred = values - means[dense]
    return centred / (stds[dense] + eps) if scale_by_std else centred


def fused_advantage(a_acc: torch.Tensor, a_ret: torch.Tensor, advantage_weight: float) -> torch.Tensor:
    """``A = A_acc * (1 + a * A_ret)`` (§6).

    Example:
        >>> fused_advantage(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 0.5]), 0.2)
        tensor([ 1.1000, -1.1000])
    """
    return a_acc * (1.0 + advantage_weight * a_ret)


def rapo_advantages(
    rewards: torch.Tensor,
    z_ret: torch.Tensor,
    group_index: torch.Tensor,
    advantage_weight: float = 0.2,
    eps: float = EPS,
    norm_by_std: bool = True,
    baseline: torch.Tensor | None = None,
) -> torch.Tensor:
    """RAPO's advantage per rollout (§6): ``A_acc * (1 + a * A_ret)`` with both normalised per group.

    ``A_ret`` normalises ``Z_ret`` over the whole group, on-policy zeros included; when every
    ``Z_ret`` of a group is 0, ``A_ret = 0`` and the result is GRPO's ``A_acc``. With
    ``norm_by_std=False`` both are only centred (Dr.GRPO). ``baseline`` (``[N]`` bool, None: all) picks the
    rollouts whose rewards give ``A_acc``'s group mean (`RAPOConfig.baseline`; not the paper's).

    Example:
        >>> group = torch.tensor([0, 0])
        >>> [round(a, 4) for a in rapo_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2), group).tolist()]
        [0.7071, -0.7071]
    """
    a_acc = group_normalize(rewards, group_index, eps, norm_by_std, reference=baseline)
    a_ret = group_normalize(z_ret, group_index, eps, norm_by_std)
    return fused_advantage(a_acc, a_ret, advantage_weight)


# ----------------------------------------------------------------------------------------------
# §7 importance shaping and loss


def retrieval_fraction(retrieval_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``F_ret`` = retrieved tokens / response tokens of each trajectory (§7); 0 for on-policy rollouts.

    Args:
        retrieval_mask: ``[B, T]`` 1 on spliced retrieval tokens.
        response_mask: ``[B, T]`` 1 on every response token (policy, tool results and retrieval).

    Example:
        >>> retrieval_fraction(torch.tensor([[0, 1, 1, 0]]), torch.tensor([[1, 1, 1, 1]])).tolist()
        [0.5]
    """
    retrieved = (retrieval_mask > 0).sum(-1).float()
    response = (response_mask > 0).sum(-1).float()
    return retrieved / response.clamp(min=1.0)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of ``KL(pi || pi_ref)``: ``exp(ref - logp) - (ref - logp) - 1`` (>= 0).

    Example:
        >>> k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).tolist()
        [0.0]
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


@dataclass
class LossOutput:
    """What :func:`rapo_policy_loss` returns: the scalar to back-propagate and detached statistics."""

    loss: torch.Tensor
    """The scalar loss (policy-gradient term plus the optional KL and entropy terms)."""
    policy_loss: torch.Tensor
    """The clipped policy-gradient term alone (detached)."""
    clip_fraction: torch.Tensor
    """Share of policy tokens where the ratio clip was active (detached)."""
    dual_clip_fraction: torch.Tensor
    """Share of policy tokens where the dual clip for ``A < 0`` was active (detached)."""
    approx_kl: torch.Tensor
    """Token mean of ``logp_old - logp_new`` (k1 estimate of the update's KL, detached)."""
    kl: torch.Tensor
    """Token mean of the k3 KL to the reference policy (0 when not computed, detached)."""
    entropy: torch.Tensor
    """Token mean of the policy entropy (0 when not given, detached)."""


def rapo_policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    f_ret: torch.Tensor | None = None,
    config: RAPOConfig | None = None,
    ref_logp: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    token_normalizer: float | torch.Tensor | None = None,
    rollout_weights: torch.Tensor | None = None,
) -> LossOutput:
    """RAPO's shaped, asymmetric- and dual-clipped policy loss, token-mean over policy tokens (§7).

    Half-precision inputs are computed in float32 (the loss and statistics come back in float32;
    gradients still reach a bf16 ``logp_new``).

    ``r = exp(logp_new - logp_old)``, ``r_hat = (1 + m F_ret) r``,
    ``L = -min(r_hat A, clip(r_hat, 1 - eps_low, 1 + eps_high) A)``, for ``A < 0``
    ``L = min(L, -c A)``, ``loss = sum(L * mask) / sum(mask)`` (+ ``kl_coef * k3`` - ``entropy_coef * H``).

    Args:
        logp_new: ``[B, T]`` log-probs of the sampled tokens under the policy being trained.
        logp_old: ``[B, T]`` log-probs under the rollout policy.
        advantages: ``[B]`` per rollout or ``[B, T]`` per token.
        mask: ``[B, T]`` 1 on policy tokens (0 on prompt, tool results, retrieval and padding).
        f_ret: ``[B]`` retrieved-token fraction ``F_ret``; None means 0 (no shaping).
        config: the weights and clip ranges; :class:`RAPOConfig` defaults when None.
        ref_logp: ``[B, T]`` reference-policy log-probs, needed when ``config.kl_coef > 0``.
        entropies: ``[B, T]`` per-token entropies, needed when ``config.entropy_coef > 0``.
        token_normalizer: divide the token sum by this instead of ``mask.sum()``; a trainer that
            accumulates gradients over micro-batches passes the token count of the whole mini-batch
            so that the accumulated loss is the mini-batch's token mean.
        rollout_weights: ``[B, T]`` sampler-mismatch weights (:func:`rollout_correction_weights`, detached) that
            multiply each token's clipped policy-gradient loss, not the KL or entropy terms; None: no weight.

    Example:
        >>> logp = torch.zeros(1, 3, requires_grad=True)
        >>> out = rapo_policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
        >>> round(out.loss.item(), 4)
        -1.0
    """
    config = config or RAPOConfig()
    if logp_new.shape != logp_old.shape or logp_new.shape != mask.shape:
        raise ValueError(
            f"logp_new, logp_old and mask must have one shape, got {tuple(logp_new.shape)}, "
            f"{tuple(logp_old.shape)}, {tuple(mask.shape)}"
        )
    if rollout_weights is not None and rollout_weights.shape != mask.shape:
        raise ValueError(f"rollout_weights must have the shape of mask {tuple(mask.shape)}, "
                         f"got {tuple(rollout_weights.shape)}")
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    if config.entropy_coef > 0 and entropies is None:
        raise ValueError("entropy_coef > 0 needs entropies")
    # bf16/fp16 inputs (verl, skrl) are computed in float32: a bf16 mask sum miscounts tokens past 256
    # (192,064 counted as 192,512) and bf16 ratios lose the clip boundaries.
    work = torch.promote_types(logp_new.dtype, torch.float32)
    logp_new, logp_old, advantages, mask = (t.to(work) for t in (logp_new, logp_old, advantages, mask))
    f_ret, ref_logp, entropies = (None if t is None else t.to(work) for t in (f_ret, ref_logp, entropies))
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    normalizer = mask.sum().clamp(min=1.0) if token_normalizer is None else token_normalizer

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum() / normalizer

    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio)
    if f_ret is not None:
        ratio = (1.0 + config.shaping_weight * f_ret).unsqueeze(-1) * ratio
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * config.clip_ratio_c
    token_loss = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    if rollout_weights is not None:
        # After the (dual) clip, as TRL (`per_token_loss * importance_sampling_ratio`) and verl
        # (`pg_losses * rollout_is_weights`) apply it: the weight corrects the sampling distribution, the clip
        # bounds the update.
        token_loss = token_loss * rollout_weights.detach().to(work)
    policy_loss = token_mean(token_loss)

    loss = policy_loss
    zero = policy_loss.new_zeros(())
    kl = zero
    if config.kl_coef > 0:
        kl = token_mean(k3_kl(logp_new, ref_logp))
        loss = loss + config.kl_coef * kl
    entropy = zero
    if entropies is not None:
        entropy = token_mean(entropies)
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * entropy

    with torch.no_grad():
        clip_active = (clipped > unclipped).to(mask.dtype)
        dual_active = ((advantages < 0) & (clip_loss > dual_bound)).to(mask.dtype)
        stats = {
            "clip_fraction": masked_mean(clip_active, mask),
            "dual_clip_fraction": masked_mean(dual_active, mask),
            "approx_kl": masked_mean(-log_ratio, mask),
        }
    return LossOutput(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl.detach(),
        entropy=entropy.detach(),
        **stats,
    )


# ----------------------------------------------------------------------------------------------
# Sampler-mismatch correction (not in the spec: TRL's and verl's truncated / masked importance sampling)

#: ``|logp_old - logp_sampler|`` is clamped to this before ``exp`` (verl's ``SAFETY_BOUND``): the weight stays
#: finite, and TIS / MIS cut it at the cap anyway.
LOG_RATIO_BOUND = 20.0


@dataclass
class RolloutCorrectionOutput:
    """What :func:`rollout_correction_weights` returns: per-token weights and detached statistics."""

    weights: torch.Tensor
    """``[B, T]`` the weight of each loss token's policy-gradient loss (0 off the mask)."""
    kl_k1: torch.Tensor
    """Token mean of ``logp_sampler - logp_old``: the k1 estimate of ``KL(pi_sampler || pi_trainer)`` (can be < 0)."""
    kl_k3: torch.Tensor
    """Token mean of ``w - 1 - log w``: the k3 estimate of ``KL(pi_sampler || pi_trainer)`` (>= 0)."""
    truncated_fraction: torch.Tensor
    """Share of loss tokens with ``w > cap``, which TIS truncates."""
    masked_fraction: torch.Tensor
    """Share of loss tokens with ``w`` outside ``[1/cap, cap]``, which MIS masks."""
    weight_mean: torch.Tensor
    """Token mean of the weights (1 for ``none``)."""


def rollout_correction_weights(
    trainer_old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: RolloutCorrection = "tis",
    cap: float = 2.0,
) -> RolloutCorrectionOutput:
    """Per-token weights that correct for sampling from another engine than the trained module.

    ``w = exp(logp_old - logp_sampler)`` is the ratio of the trainer's recomputed ``logp_old`` to the sampler's
    log-prob of each sampled token. ``tis`` (truncated IS): ``min(w, cap)``, as TRL's
    ``vllm_importance_sampling_mode="token_truncate"`` (``vllm_importance_sampling_cap``, default 2) and verl's
    ``rollout_is=token`` (``rollout_is_threshold``, default 2; formerly ``tis_imp_ratio_cap``). ``mis`` (masked
    IS): ``w`` where ``1/cap <= w <= cap``, else 0, as verl's token-level mask with its default lower threshold
    ``1/upper``; TRL's ``token_mask`` masks only ``w > cap`` (one-sided). A masked token stays in the loss's
    token count, as in TRL (verl also drops it from the denominator). ``none``: weight 1.

    Args:
        trainer_old_logprobs: ``[B, T]`` ``logp_old`` recomputed by the trained module.
        sampler_logprobs: ``[B, T]`` the log-probs the sampler reported for the same tokens.
        mask: ``[B, T]`` 1 on the policy's tokens (the loss mask).
        mode: ``none``, ``tis`` or ``mis``.
        cap: the truncation / masking threshold, > 1.

    Example:
        >>> trainer = torch.log(torch.tensor([[0.9, 0.5, 0.1, 0.5]]))
        >>> sampler = torch.log(torch.tensor([[0.3, 0.5, 0.5, 0.5]]))   # w = 3, 1, 0.2 and (off the mask) 1
        >>> mask = torch.tensor([[1, 1, 1, 0]])
        >>> [round(w, 4) for w in rollout_correction_weights(trainer, sampler, mask, "tis", 2.0).weights[0].tolist()]
        [2.0, 1.0, 0.2, 0.0]
        >>> rollout_correction_weights(trainer, sampler, mask, "mis", 2.0).weights[0].tolist()
        [0.0, 1.0, 0.0, 0.0]
    """
    if mode not in ("none", "tis", "mis"):
        raise ValueError(f"mode must be 'none', 'tis' or 'mis', got {mode!r}")
    if not (math.isfinite(cap) and cap > 1.0):
        raise ValueError(f"cap must be a finite number > 1, got {cap}")
    if not (trainer_old_logprobs.shape == sampler_logprobs.shape == mask.shape):
        raise ValueError(
            "trainer_old_logprobs, sampler_logprobs and mask must have one shape, got "
            f"{tuple(trainer_old_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    work = torch.promote_types(trainer_old_logprobs.dtype, torch.float32)
    with torch.no_grad():
        mask = mask.to(work)
        log_ratio = (trainer_old_logprobs.to(work) - sampler_logprobs.to(work)) * mask
        log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        ratio = torch.exp(log_ratio)
        above = ratio > cap
        outside = above | (ratio < 1.0 / cap)
        if mode == "tis":
            weights = ratio.clamp(max=cap)
        elif mode == "mis":
            weights = torch.where(outside, torch.zeros_like(ratio), ratio)
        else:
            weights = torch.ones_like(ratio)
        weights = weights * mask
        return RolloutCorrectionOutput(
            weights=weights,
            kl_k1=masked_mean(-log_ratio, mask),
            kl_k3=masked_mean(ratio - 1.0 - log_ratio, mask),
            truncated_fraction=masked_mean(above.to(work), mask),
            masked_fraction=masked_mean(outside.to(work), mask),
            weight_mean=masked_mean(weights, mask),
        )
