"""RAPO's advantage estimator and policy loss in verl's registries (``verl.trainer.ppo.core_algos``).

Both functions only translate verl's tensors and configs and then call `rapo_agents.rapo`, so the
numbers are rapo's own (spec §6-7):

- ``algorithm.adv_estimator=rapo``: ``A = A_acc * (1 + a * A_ret)`` per group of ``uid``. Without
  ``retrieval_reward`` (verl's stock trainer passes none) every ``Z_ret`` is 0 and RAPO reduces to
  GRPO; `rapo_agents.integrations.verl.trainer` passes ``Z_ret`` and ``a``.
- ``actor.policy_loss.loss_mode=rapo``: RAPO's shaped, asymmetric- and dual-clipped loss. verl hands
  a policy loss a fixed set of tensors, so the per-rollout shaping factor ``s = 1 + m * F_ret``
  arrives as ``rollout_is_weights`` (per token, as the rapo trainer writes it) and the ratio
  becomes ``s * r`` *inside* the clip, as spec §7 states. Without it, ``s = 1``.

Example:
    >>> import numpy as np, torch
    >>> rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])            # outcome reward on the last token
    >>> advantages, _ = compute_rapo_outcome_advantage(rewards, torch.ones(2, 2), np.array(["q", "q"]))
    >>> [round(a, 4) for a in advantages[:, 0].tolist()]
    [0.7071, -0.7071]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss

from rapo_agents.rapo import EPS, RAPOConfig, masked_mean, rapo_advantages, rapo_policy_loss

ESTIMATOR_NAME = "rapo"
"""``algorithm.adv_estimator`` value that selects RAPO's advantage."""

POLICY_LOSS_NAME = "rapo"
"""``actor_rollout_ref.actor.policy_loss.loss_mode`` value that selects RAPO's loss."""


def group_ids(index: Any) -> torch.Tensor:
    """verl's per-row group keys (``uid`` strings, ints, anything hashable) as dense integer ids.

    Example:
        >>> group_ids(np.array(["b", "a", "b"], dtype=object)).tolist()
        [0, 1, 0]
    """
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(key, len(dense)) for key in list(index)], dtype=torch.long)


@register_adv_est(ESTIMATOR_NAME)
def compute_rapo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = EPS,
    config: Any = None,
    retrieval_reward: torch.Tensor | None = None,
    advantage_weight: float = 0.2,
    norm_adv_by_std_in_grpo: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RAPO's fused advantage (spec §6) broadcast over each response, as verl's estimators return it.

    Args:
        token_level_rewards: ``(bs, response_length)``; the outcome reward ``R`` is their row sum.
        response_mask: ``(bs, response_length)`` 1 on response tokens.
        index: ``(bs,)`` group key of each row (verl's ``uid``: one per question).
        epsilon: added to the group stds.
        config: verl's ``AlgoConfig``; only its ``norm_adv_by_std_in_grpo`` is read (RAPO's own knobs come as
            arguments, verl's config has no room for them).
        retrieval_reward: ``(bs,)`` ``Z_ret`` of each rollout; None means 0 (GRPO).
        advantage_weight: ``a`` in ``A_acc * (1 + a * A_ret)``.
        norm_adv_by_std_in_grpo: False only centres ``R`` and ``Z_ret`` (Dr.GRPO); None: ``config``'s, else True.
        **kwargs: other keyword arguments verl passes to every estimator (e.g. ``reward_baselines``); ignored.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and equal, as for GRPO.
    """
    rewards = token_level_rewards.sum(dim=-1)
    if len(index) != rewards.shape[0]:
        raise ValueError(f"index has {len(index)} entries for {rewards.shape[0]} rows")
    z_ret = torch.zeros_like(rewards) if retrieval_reward is None else retrieval_reward.to(rewards)
    norm_by_std = norm_adv_by_std_in_grpo
    if norm_by_std is None:
        norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    with torch.no_grad():
        advantages = rapo_advantages(
            rewards, z_ret, group_ids(index).to(rewards.device), advantage_weight=advantage_weight, eps=epsilon,
            norm_by_std=norm_by_std,
        )
        advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


def rapo_config_from_actor(config: Any) -> RAPOConfig:
    """A `RAPOConfig` with the clip ranges of verl's actor config and shaping weight 1.

    The shaping weight is 1 because the factor verl passes already is ``1 + m * F_ret``: with
    ``f_ret = s - 1`` and weight 1 the ratio becomes ``s * r``.
    """
    if config is None:
        raise ValueError("the rapo policy loss needs verl's actor config (clip ranges)")
    clip = config.get("clip_ratio", 0.2)
    low = config.get("clip_ratio_low", None)
    high = config.get("clip_ratio_high", None)
    return RAPOConfig(
        clip_ratio_low=clip if low is None else low,
        clip_ratio_high=clip if high is None else high,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
        shaping_weight=1.0,
    )


@register_policy_loss(POLICY_LOSS_NAME)
def compute_policy_loss_rapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """RAPO's policy loss (spec §7) with verl's policy-loss signature.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``(bs, response_length)`` as verl gives them;
            ``response_mask`` is the loss mask (policy tokens only: the rapo agent loop zeroes tool
            results and spliced retrieval text).
        loss_agg_mode: must be ``token-mean`` (the spec's aggregation).
        config: verl's ``ActorConfig`` (``clip_ratio_low``/``high``, ``clip_ratio_c``).
        rollout_is_weights: ``(bs, response_length)`` the shaping factor ``1 + m * F_ret`` of each
            token's rollout; None means no shaping.

    Returns:
        ``(loss, metrics)`` with verl's metric names.
    """
    if loss_agg_mode != "token-mean":
        raise ValueError(f"the rapo policy loss is a token mean (spec §7); got loss_agg_mode={loss_agg_mode!r}")
    rapo_config = rapo_config_from_actor(config)
    f_ret = None
    if rollout_is_weights is not None:
        # With shaping weight 1, "f_ret" is m * F_ret: the factor minus one.
        f_ret = masked_mean(rollout_is_weights.to(log_prob.dtype), response_mask, dim=-1) - 1.0
    # rapo's token mean divides by the mask sum; verl's global batch info spreads it over data-parallel ranks.
    batch_info = getattr(config, "global_batch_info", None) or {}
    normalizer = None
    if batch_info.get("batch_num_tokens") is not None:
        normalizer = float(batch_info["batch_num_tokens"]) / float(batch_info.get("dp_size") or 1)
    out = rapo_policy_loss(
        log_prob, old_log_prob, advantages, response_mask, f_ret=f_ret, config=rapo_config, token_normalizer=normalizer
    )
    metrics = {
        "actor/pg_clipfrac": out.clip_fraction.item(),
        "actor/ppo_kl": out.approx_kl.item(),
        "actor/pg_clipfrac_lower": out.dual_clip_fraction.item(),
    }
    if f_ret is not None:
        metrics["actor/rapo_shaping_factor"] = 1.0 + f_ret.mean().item()
    return out.loss, metrics
