"""`RapoPPOTrainer`: verl's synchronous v1 trainer with RAPO's advantage step (``trainer.v1.trainer_mode=rapo``).

verl's estimators and losses see a fixed set of tensors, so the one step that needs RAPO's extra
data is overridden here, through verl's own ``register_trainer`` extension point:

- ``_compute_advantage`` reads each rollout's ``extra_fields["rapo"]`` (written by
  `RapoEnvAgentLoop`) and the actor's per-token entropies (verl computes them with the old
  log-probs), computes ``Z_ret`` and ``F_ret`` with `protocol.retrieval_terms_from_fields`,
  calls the registered ``rapo`` estimator with ``Z_ret``, and stores the shaping factor
  ``1 + m * F_ret`` as ``rollout_is_weights`` for the registered ``rapo`` policy loss. It
  returns the batch meta of that write (verl's actor update reads only the fields a meta names),
  and keeps verl's padding rows (tag ``is_padding``) out of the retrieval terms and metrics.

RAPO's knobs live in a top-level ``rapo:`` section of the verl config (verl's ``algorithm``
dataclass has no room for them): ``advantage_weight`` (0.2), ``shaping_weight`` (0.05),
``fidelity`` (``paper``; it must equal the agent loop's ``fidelity``, which every rollout records)
and ``step_entropy``. The reference's step entropy needs the top-10 sampling log-probs of every
generated token, which verl's rollout servers do not return, so ``fidelity: reference`` is refused
unless ``step_entropy: paper`` says to use the paper's estimator (over the actor's entropies) with
the rest of the reference mode (``+verl_fidelity=reference``, ``configs/verl_fidelity/reference.yaml``).

What is checked without GPUs: the pieces this step calls (`protocol`, the registered estimator
and loss) against rapo's own functions, that the class registers, and the step itself against a
real TransferQueue on a local CPU Ray (``tests/rapo_agents/integrations/test_verl_transfer_queue.py``:
rollouts written as verl's rollout, padding and old-log-prob steps write them; what the step writes
back equals rapo's functions). Only the whole loop, with verl's workers, needs the GPU-marked test.

Example (import only; running it needs verl's Ray workers and TransferQueue):
    >>> from verl.trainer.ppo.v1 import get_trainer_cls
    >>> from rapo_agents.integrations.verl.trainer import RapoPPOTrainer, TRAINER_NAME
    >>> get_trainer_cls(TRAINER_NAME) is RapoPPOTrainer
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from rapo_agents.integrations.verl.algos import ESTIMATOR_NAME, compute_rapo_outcome_advantage
from rapo_agents.integrations.verl.protocol import (
    EXTRA_FIELD,
    check_fidelity,
    retrieval_terms_from_fields,
    shaping_factor,
)

TRAINER_NAME = "rapo"
"""``trainer.v1.trainer_mode`` value that selects this trainer."""


def rapo_settings(config: Any) -> tuple[float, float]:
    """``(advantage_weight, shaping_weight)`` from the config's ``rapo`` section (spec §8 defaults)."""
    section = config.get("rapo", None) or {}
    return float(section.get("advantage_weight", 0.2)), float(section.get("shaping_weight", 0.05))


def rapo_fidelity(config: Any) -> str:
    """``rapo.fidelity`` of a verl config (``paper`` when absent), checked against what verl can do.

    Raises:
        ValueError: an unknown fidelity, or ``reference`` without ``rapo.step_entropy: paper`` (the
            reference's top-k step entropy needs rollout statistics verl does not return).

    Example:
        >>> rapo_fidelity({"rapo": {"fidelity": "reference", "step_entropy": "paper"}})
        'reference'
    """
    section = config.get("rapo", None) or {}
    fidelity = check_fidelity(str(section.get("fidelity", "paper")))
    step_entropy = str(section.get("step_entropy", "auto"))
    if step_entropy not in ("auto", "paper", "reference"):
        raise ValueError(f"rapo.step_entropy must be 'auto', 'paper' or 'reference', got {step_entropy!r}")
    if (fidelity == "reference" and step_entropy != "paper") or step_entropy == "reference":
        raise ValueError(
            "the reference's step entropy (the top-10 sampling log-probs of each step's first 20 tokens) cannot be "
            "computed under verl: its rollout servers return only the sampled token's log-prob. Set "
            "rapo.step_entropy=paper to run the reference's hybrid split, candidate rule and fallback splice with "
            "the paper's step entropy (configs/verl_fidelity/reference.yaml does), or train with `rapo train` for the "
            "reference's estimator")
    return fidelity


def mean_or_zero(values: torch.Tensor) -> float:
    """Mean of ``values`` as a float; 0 for none (a batch of padding only)."""
    return values.float().mean().item() if values.numel() else 0.0


@register_trainer(TRAINER_NAME)
class RapoPPOTrainer(PPOTrainerSync):
    """verl's synchronous trainer whose advantage step is RAPO's (see the module docstring)."""

    fidelity: str = "paper"
    """``rapo.fidelity`` (`rapo_fidelity`); every rollout's record must carry the same."""

    def __init__(self, config: Any):
        algorithm = config.algorithm
        if algorithm.adv_estimator != ESTIMATOR_NAME:
            raise ValueError(f"trainer_mode=rapo needs algorithm.adv_estimator={ESTIMATOR_NAME}")
        if algorithm.get("use_kl_in_reward", False):
            raise ValueError("RAPO uses no in-reward KL penalty (spec §7): set algorithm.use_kl_in_reward=false")
        correction = algorithm.get("rollout_correction", None) or {}
        if correction.get("rollout_is") or correction.get("rollout_rs") or correction.get("bypass_mode", False):
            raise ValueError(
                "trainer_mode=rapo passes RAPO's shaping factor in rollout_is_weights and needs the actor's "
                "entropies of a recomputed old policy: leave algorithm.rollout_correction at rollout_is=null, "
                "rollout_rs=null, bypass_mode=false"
            )
        self.advantage_weight, self.shaping_weight = rapo_settings(config)
        self.fidelity = rapo_fidelity(config)
        self.norm_adv_by_std = bool(algorithm.get("norm_adv_by_std_in_grpo", True))  # false: Dr.GRPO
        super().__init__(config)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """RAPO's advantages, returns and shaping factors for ``batch``, written to TransferQueue.

        Returns the batch meta of that write: verl's actor update reads only the fields a batch
        meta names, so it must name ``advantages`` and ``rollout_is_weights`` (verl's own step
        returns its write's meta too). Rows verl added as padding (tag ``is_padding``: a copy of
        the first row's fields, rapo's record included, with a masked response) count as rollouts
        without retrieval and stay out of the ``rapo/`` metrics.
        """
        fields = ["uid", "response_mask", "rm_scores", "entropy", "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        padded = DataProto(batch=data.to_padded_tensor())
        uid = np.array(padded.batch.pop("uid").tolist(), dtype=object)
        is_rollout = np.array([not tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
        records = [
            (extra or {}).get(EXTRA_FIELD) if rollout else None
            for extra, rollout in zip(padded.batch.pop("extra_fields").tolist(), is_rollout, strict=True)
        ]
        mask = padded.batch["response_mask"].float()
        entropy = padded.batch["entropy"].float() * mask
        z_ret, f_ret = retrieval_terms_from_fields(entropy, records, fidelity=self.fidelity)
        advantages, returns = compute_rapo_outcome_advantage(
            padded.batch["rm_scores"].float(),
            mask,
            uid,
            retrieval_reward=z_ret,
            advantage_weight=self.advantage_weight,
            norm_adv_by_std_in_grpo=self.norm_adv_by_std,
        )
        output = {
            "advantages": response_to_nested(advantages, nested_mask),
            "returns": response_to_nested(returns, nested_mask),
            "rollout_is_weights": response_to_nested(shaping_factor(f_ret, mask, self.shaping_weight), nested_mask),
        }
        written = tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
        )
        with_retrieval = np.array([bool(record and any(record["retrieved_after"])) for record in records])
        rollouts = torch.from_numpy(is_rollout)
        metrics.update({
            "rapo/z_ret_mean": mean_or_zero(z_ret[rollouts]),
            "rapo/f_ret_mean": mean_or_zero(f_ret[rollouts]),
            "rapo/rollouts_with_retrieval": mean_or_zero(torch.from_numpy(with_retrieval[is_rollout]).float()),
        })
        return written
