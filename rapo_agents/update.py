"""The PPO-style update of one batch: micro-batched forward/backward, token-mean loss, AdamW step.

`sequence_logprobs` recomputes the log-probs of a batch's tokens with the model being trained;
`ppo_update` runs ``ppo_epochs`` passes of mini-batches (``ppo_mini_batch_size`` questions each),
accumulating gradients over micro-batches so that each optimiser step minimises the token mean of
RAPO's loss (spec §7) over its whole mini-batch.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    >>> ids = torch.tensor([[1, 2, 3, 4]])
    >>> response = torch.tensor([[0, 0, 1, 1]])
    >>> logprobs = sequence_logprobs(model, ids, torch.ones_like(ids), response).logprobs
    >>> logprobs.shape, bool((logprobs[0, :2] == 0).all()), bool((logprobs[0, 2:] < 0).all())
    (torch.Size([1, 4]), True, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from rapo_agents.batch import TrainBatch
from rapo_agents.config import OptimConfig
from rapo_agents.rapo import (
    LossWeighting,
    RAPOConfig,
    rapo_policy_loss,
    rollout_correction_weights,
    token_entropy_from_logits,
)

#: The `ppo_update` statistics under ``rollout_correction/`` (`rapo_agents.rapo.RolloutCorrectionOutput`'s fields).
ROLLOUT_CORRECTION_STATS = ("kl_k1", "kl_k3", "truncated_fraction", "masked_fraction", "weight_mean")


@dataclasses.dataclass
class SequenceLogprobs:
    """What `sequence_logprobs` returns, aligned with the input tokens."""

    logprobs: torch.Tensor
    """``[B, T]``: ``log p(x_t | x_<t)`` where ``token_mask`` is set, 0 elsewhere."""
    entropies: torch.Tensor | None
    """``[B, T]`` full-vocabulary entropy of the distribution that produced ``x_t`` (when asked; 0 where the log-prob
    is)."""


LOGIT_SCALINGS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of causal LMs whose logits are not the plain output projection of the last hidden state (Gemma's
soft-capping, Cohere's and Granite's scales): `sequence_logprobs` takes their logits from the model's own forward."""


def _logits_at(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[N, vocab]`` logits at the given (row, position) pairs of one forward pass.

    Only those positions go through the vocabulary projection, the largest matmul of a small model: in a
    multi-turn batch the tool results, prompts and padding carry no loss, and the policy's own tokens were 31% of
    the positions after the shortest prompt in a `configs/qa.yaml` batch.
    """
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1) for name in LOGIT_SCALINGS):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return logits[rows, positions]
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return model.get_output_embeddings()(hidden.last_hidden_state[rows, positions])


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_mask: torch.Tensor,
    with_entropy: bool = False,
) -> SequenceLogprobs:
    """Log-probs (and optionally entropies) of the tokens ``token_mask`` marks, in one forward pass.

    The loss of every caller covers only its loss-mask tokens, so only their predicting positions are projected
    onto the vocabulary (`_logits_at`); the first token, which nothing predicts, and padding are never marked.
    """
    marked = token_mask.bool() & attention_mask.bool()
    marked[:, 0] = False
    rows, positions = marked.nonzero(as_tuple=True)
    logits = _logits_at(model, input_ids, attention_mask, rows, positions - 1).float()  # t - 1 predicts t
    token_logprobs = -F.cross_entropy(logits, input_ids[rows, positions], reduction="none")
    logprobs = token_logprobs.new_zeros(input_ids.shape).index_put((rows, positions), token_logprobs)
    entropies = None
    if with_entropy:
        token_entropies = token_entropy_from_logits(logits)
        entropies = token_entropies.new_zeros(input_ids.shape).index_put((rows, positions), token_entropies)
    return SequenceLogprobs(logprobs=logprobs, entropies=entropies)


def micro_batches(batch: TrainBatch, rows: torch.Tensor, micro_batch_size: int) -> Iterator[TrainBatch]:
    """Split ``rows`` into micro-batches of similar lengths (less padding), each trimmed to its longest row."""
    order = rows[torch.argsort(batch.lengths[rows], descending=True)]
    for start in range(0, len(order), micro_batch_size):
        yield batch.select(order[start : start + micro_batch_size])


def micro_batch_weight(
    weighting: LossWeighting, micro_loss_mask: torch.Tensor, mini_loss_mask: torch.Tensor
) -> float:
    """The factor of a micro-batch's own token-mean loss in its mini-batch's loss.

    ``token_mean`` (rapo, spec §7): its share of the mini-batch's policy tokens, so that the sum over
    micro-batches is the mini-batch's token mean whatever the split. ``micro_batch_mean`` (verl under
    dynamic batch size): its share of the mini-batch's sequences.

    Example:
        >>> mini = torch.tensor([[1, 1, 1], [1, 0, 0]])
        >>> micro_batch_weight("token_mean", mini[1:], mini), micro_batch_weight("micro_batch_mean", mini[1:], mini)
        (0.25, 0.5)
    """
    if weighting == "micro_batch_mean":
        return micro_loss_mask.shape[0] / mini_loss_mask.shape[0]
    return float(micro_loss_mask.sum()) / max(float(mini_loss_mask.sum()), 1.0)


@dataclasses.dataclass
class UpdateSettings:
    """The schedule of one `ppo_update`."""

    mini_batch_rows: int
    """Sequences per optimiser step (``ppo_mini_batch_size * rollout_n``)."""
    micro_batch_size: int
    """Sequences per forward/backward."""
    ppo_epochs: int = 1
    """Passes over the batch."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    autocast_dtype: torch.dtype | None = None
    """Forward under autocast to this dtype (bfloat16 on GPU), or None."""
    old_logprobs_from_current: bool = False
    """Take ``logp_old`` from the update's own forward pass (detached) instead of ``batch.old_logprobs``. Exactly what
    `recompute_logprobs` gives when the update is one optimiser step (one epoch, one mini-batch), without its
    extra forward pass; wrong for any longer schedule, where the weights move between mini-batches."""


def update_settings(optim: OptimConfig, rollout_n: int, autocast_dtype: torch.dtype | None = None,
                    recompute_old_logprobs: bool = False) -> UpdateSettings:
    """The schedule of a trainer's updates from its ``optim`` section; with ``recompute_old_logprobs`` and one
    optimiser step per batch, ``logp_old`` comes from the update's own forward pass (no extra one)."""
    one_step = optim.ppo_epochs == 1 and optim.ppo_mini_batch_size == optim.train_batch_size
    return UpdateSettings(
        mini_batch_rows=optim.ppo_mini_batch_size * rollout_n, micro_batch_size=optim.micro_batch_size,
        ppo_epochs=optim.ppo_epochs, grad_clip=optim.grad_clip, autocast_dtype=autocast_dtype,
        old_logprobs_from_current=recompute_old_logprobs and one_step)


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def needs_logprob_correction(policy: object) -> bool:
    """Whether ``policy``'s rollout log-probs come from another engine than the trained module (``exact_logprobs``
    False, as for `rapo_agents.policies.fast.FastPolicy`'s int8 decoder): the trainer then recomputes ``logp_old``
    with the trained module (`recompute_logprobs`), so that the PPO ratio starts at exactly 1 (measured mean
    |diff| on SmolLM2-135M int8: ~0.15 nats per token, see ``benchmarks/generation.py``)."""
    return not getattr(policy, "exact_logprobs", True)


def logprob_mismatch(rollout: torch.Tensor, recomputed: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
    """Mean and max ``|rollout - recomputed|`` log-prob over the loss tokens (what the correction removed)."""
    diff = (rollout - recomputed).abs()[loss_mask.bool()]
    if diff.numel() == 0:
        return {"logprob/rollout_abs_diff_mean": 0.0, "logprob/rollout_abs_diff_max": 0.0}
    return {"logprob/rollout_abs_diff_mean": float(diff.mean()), "logprob/rollout_abs_diff_max": float(diff.max())}


@torch.no_grad()
def recompute_logprobs(model: torch.nn.Module, batch: TrainBatch, settings: UpdateSettings) -> torch.Tensor:
    """``logp_old`` recomputed by the trainer's forward pass (as verl does), aligned with the batch."""
    device = next(model.parameters()).device
    result = torch.zeros_like(batch.old_logprobs)
    rows = torch.arange(batch.input_ids.shape[0])
    was_training = model.training
    model.eval()
    try:
        order = rows[torch.argsort(batch.lengths, descending=True)]
        for start in range(0, len(order), settings.micro_batch_size):
            chosen = order[start : start + settings.micro_batch_size]
            micro = batch.select(chosen).to(device)
            with autocast_context(device, settings.autocast_dtype):
                out = sequence_logprobs(model, micro.input_ids, micro.attention_mask, micro.loss_mask)
            width = micro.input_ids.shape[1]
            result[chosen, :width] = out.logprobs.float().cpu()  # 0 off the loss mask
    finally:
        model.train(was_training)
    return result


def update_policy(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, config: RAPOConfig,
                  settings: UpdateSettings, reference_model: torch.nn.Module | None = None,
                  recompute_old_logprobs: bool = False) -> dict[str, float]:
    """The update of one training batch (spec §7): `ppo_update`, on ``logp_old`` recomputed by the trained module
    when asked (`recompute_logprobs`, unless ``settings`` takes them from the update's own forward pass).

    A batch without reward variance (and no KL or entropy term) is skipped: its loss is identically 0, so the
    forward and backward passes would only buy AdamW's weight decay, as GRPO-style trainers that drop
    zero-variance groups know. ``optim/skipped_zero_advantage`` counts it.
    """
    if not batch.advantages.any() and config.kl_coef == 0 and config.entropy_coef == 0:
        return {"optim/skipped_zero_advantage": 1.0, "time/update_s": 0.0}
    if recompute_old_logprobs and not settings.old_logprobs_from_current:
        batch.old_logprobs = recompute_logprobs(model, batch, settings)
    stats = ppo_update(model, optimizer, batch, config, settings, reference_model)
    return {**stats, "optim/skipped_zero_advantage": 0.0}


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    config: RAPOConfig,
    settings: UpdateSettings,
    reference_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """Run the PPO-style epochs over ``batch`` and return the averaged statistics.

    Each mini-batch is one optimiser step; its loss is RAPO's token mean over all of its policy
    tokens, whatever the micro-batch split (or verl's weighting, ``config.loss_weighting``, see
    `micro_batch_weight`). A step whose gradient norm is not finite is skipped (and counted)
    instead of corrupting the weights.

    With ``config.rollout_correction`` ``tis`` or ``mis``, each token's policy-gradient loss is weighted by
    the truncated or masked ratio of ``logp_old`` (recomputed by the trainer) to the sampler's log-prob
    (`rapo_agents.rapo.rollout_correction_weights`). Whatever the mode, ``rollout_correction/*`` reports the
    sampler/trainer KL (k1 and k3 estimates of ``KL(pi_sampler || pi_trainer)``), the shares of tokens TIS would
    truncate and MIS would mask, and the mean weight, when the batch has its ``sampler_logprobs``.
    """
    device = next(model.parameters()).device
    model.train()
    totals: dict[str, list[float]] = defaultdict(list)
    rows_total = batch.input_ids.shape[0]
    tokens = 0
    started = time.perf_counter()
    skipped = 0
    for _ in range(settings.ppo_epochs):
        for start in range(0, rows_total, settings.mini_batch_rows):
            rows = torch.arange(start, min(start + settings.mini_batch_rows, rows_total))
            optimizer.zero_grad(set_to_none=True)
            for micro in micro_batches(batch, rows, settings.micro_batch_size):
                micro = micro.to(device)
                with autocast_context(device, settings.autocast_dtype):
                    current = sequence_logprobs(model, micro.input_ids, micro.attention_mask, micro.loss_mask,
                                                with_entropy=config.entropy_coef > 0)
                    reference = None
                    if reference_model is not None and config.kl_coef > 0:
                        with torch.no_grad():
                            reference = sequence_logprobs(reference_model, micro.input_ids,
                                                          micro.attention_mask, micro.loss_mask).logprobs
                old_logprobs = current.logprobs.detach() if settings.old_logprobs_from_current else micro.old_logprobs
                correction = None
                if micro.sampler_logprobs is not None:
                    correction = rollout_correction_weights(
                        old_logprobs, micro.sampler_logprobs, micro.loss_mask, config.rollout_correction,
                        config.rollout_correction_cap)
                elif config.rollout_correction != "none":
                    raise ValueError(f"rollout_correction={config.rollout_correction} needs the batch's "
                                     "sampler_logprobs (build it with rapo_agents.batch.build_batch)")
                out = rapo_policy_loss(
                    current.logprobs, old_logprobs, micro.advantages, micro.loss_mask, micro.f_ret,
                    config, ref_logp=reference, entropies=current.entropies,
                    rollout_weights=None if config.rollout_correction == "none" else correction.weights,
                )
                share = micro_batch_weight(config.loss_weighting, micro.loss_mask, batch.loss_mask[rows])
                (out.loss * share).backward()
                for name in ("policy_loss", "clip_fraction", "dual_clip_fraction", "approx_kl", "kl", "entropy"):
                    totals[f"loss/{name}"].append(getattr(out, name).item() * share)
                for name in ROLLOUT_CORRECTION_STATS if correction is not None else ():
                    totals[f"rollout_correction/{name}"].append(getattr(correction, name).item() * share)
                tokens += int(micro.attention_mask.sum().item())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            if torch.isfinite(grad_norm):
                optimizer.step()
            else:
                skipped += 1
            totals["optim/grad_norm"].append(float(grad_norm))
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    steps = max(1, len(totals["optim/grad_norm"]))
    stats = {key: sum(values) / (steps if key.startswith(("loss/", "rollout_correction/")) else len(values))
             for key, values in totals.items()}
    stats["optim/steps"] = float(steps)
    stats["optim/skipped_steps"] = float(skipped)
    stats["throughput/update_tokens_per_s"] = tokens / max(seconds, 1e-9)
    stats["time/update_s"] = seconds
    return stats
