"""From the rollout engine's trajectories to the tensors of one RAPO update (spec §5-7).

The rollout engine's `collate_trajectories` pads the token-level record; this module adds what
RAPO computes from it: ``Z_ret`` from step entropies and retrieval marks (§5), ``F_ret`` from the
retrieval token mask (§7), and the fused advantages per question group (§6).

Example:
    >>> from rapo_env.trajectory import StepRecord, Trajectory
    >>> def rollout(index, reward):
    ...     step = StepRecord(action="a", observation="", token_start=2, token_end=4, entropy_paper=1.0)
    ...     return Trajectory(task_id="q", rollout_index=index, question="q", system_prompt="", prompt="q",
    ...                       steps=[step], reward=reward, metrics={}, num_tool_calls=0, end_reason="answer",
    ...                       source="example", token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
    ...                       logprobs=[0.0, 0.0, -0.5, -0.7], prompt_length=2)
    >>> batch = build_batch([rollout(0, 1.0), rollout(1, 0.0)], pad_token_id=0)
    >>> batch.input_ids.shape, [round(a, 3) for a in batch.advantages.tolist()]
    (torch.Size([2, 4]), [0.707, -0.707])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from rapo_agents.rapo import (
    RAPOConfig,
    rapo_advantages,
    retrieval_entropy_pairs,
    retrieval_fraction,
    retrieval_reward,
)
from rapo_agents.rollout.collate import collate_trajectories
from rapo_env.trajectory import Trajectory


@dataclasses.dataclass
class TrainBatch:
    """The padded tensors of one update (right padding; positions align with ``input_ids``)."""

    input_ids: torch.Tensor
    """``[B, T]`` prompt and response tokens."""
    attention_mask: torch.Tensor
    """``[B, T]`` 1 on real tokens."""
    loss_mask: torch.Tensor
    """``[B, T]`` 1 on policy-generated tokens only."""
    old_logprobs: torch.Tensor
    """``[B, T]`` ``logp_old`` of the PPO ratio (0 off the loss mask): the sampler's log-probs as collected, or the
    trained module's when the trainer recomputes them (`rapo_agents.update.recompute_logprobs`)."""
    advantages: torch.Tensor
    """``[B]`` RAPO advantage of each rollout."""
    f_ret: torch.Tensor
    """``[B]`` retrieved-token fraction ``F_ret``."""
    rewards: torch.Tensor
    """``[B]`` outcome rewards."""
    z_ret: torch.Tensor
    """``[B]`` retrieval rewards ``Z_ret``."""
    retrievals: torch.Tensor
    """``[B]`` number of splices in each rollout."""
    entropy_pre: torch.Tensor
    """``[B]`` mean ``H_pre`` (the step entropy before a splice) over the rollout's scored splices; NaN for none."""
    entropy_post: torch.Tensor
    """``[B]`` mean ``H_post`` (the first policy step's entropy after a splice) over the same; NaN for none."""
    prompt_lengths: torch.Tensor
    """``[B]`` tokens of each prompt."""
    sampler_logprobs: torch.Tensor | None = None
    """``[B, T]`` the log-probs the sampler reported (0 off the loss mask), kept when ``old_logprobs`` is
    recomputed: the sampler-mismatch correction (``algorithm.rollout_correction``) weighs each token by
    ``exp(old_logprobs - sampler_logprobs)``. None (a batch built by hand): no correction is possible."""

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` real tokens of each row."""
        return self.attention_mask.sum(-1)

    def select(self, rows: torch.Tensor | Sequence[int]) -> TrainBatch:
        """The rows ``rows``, re-padded to their own longest length."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[rows].max().item()) if len(rows) else 0
        return TrainBatch(**{
            field.name: (None if value is None else value[rows, :width] if value.dim() == 2 else value[rows])
            for field in dataclasses.fields(self)
            for value in [getattr(self, field.name)]
        })

    def to(self, device: torch.device | str) -> TrainBatch:
        """The same batch on ``device``."""
        return TrainBatch(**{field.name: None if value is None else value.to(device)
                             for field in dataclasses.fields(self) for value in [getattr(self, field.name)]})


def build_batch(
    trajectories: Sequence[Trajectory], pad_token_id: int, config: RAPOConfig | None = None
) -> TrainBatch:
    """Pad trajectories and compute ``Z_ret``, ``F_ret`` and RAPO's advantages per question group.

    A retrieval recorded on step ``s`` was spliced into the observation after that step, so
    ``H_pre = H(s)`` and ``H_post = H(s + 1)``; a step without an entropy under the chosen estimator
    (a backend that gave none) invalidates the retrievals around it rather than inventing a value.
    Groups come from ``extra["group_index"]`` (the engine's), else from the task ids.

    Raises:
        ValueError: for an empty list or a trajectory without a consistent token-level record.
    """
    config = config or RAPOConfig()
    tensors = collate_trajectories(trajectories, pad_token_id)
    entropies = tensors[f"step_entropy_{config.entropy_estimator}"]
    known = tensors["step_mask"] & ~torch.isnan(entropies)
    h_pre, h_post, valid = retrieval_entropy_pairs(entropies.nan_to_num(0.0), known, tensors["step_retrieved"])
    z_ret = retrieval_reward(h_pre, h_post, valid, config.eps)
    scored = valid.sum(-1)
    entropy_pre, entropy_post = ((h * valid).sum(-1) / scored.clamp(min=1) for h in (h_pre, h_post))
    attention = tensors["attention_mask"]
    positions = torch.arange(attention.shape[1])[None, :]
    response_mask = (attention > 0) & (positions >= tensors["prompt_lengths"][:, None])
    rewards = tensors["rewards"]
    spliced = tensors["step_retrieved"].sum(-1) > 0
    loss_mask = tensors["loss_mask"] if config.spliced_loss else tensors["loss_mask"] * ~spliced[:, None]
    return TrainBatch(
        input_ids=tensors["input_ids"],
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=tensors["old_logprobs"],
        advantages=rapo_advantages(rewards, z_ret, tensors["group_ids"], config.advantage_weight, config.eps,
                                   config.norm_adv_by_std_in_grpo,
                                   baseline=~spliced if config.baseline == "on_policy" else None),
        f_ret=retrieval_fraction(tensors["retrieval_mask"], response_mask),
        rewards=rewards,
        z_ret=z_ret,
        retrievals=tensors["step_retrieved"].sum(-1),
        entropy_pre=entropy_pre.where(scored > 0, torch.nan),
        entropy_post=entropy_post.where(scored > 0, torch.nan),
        prompt_lengths=tensors["prompt_lengths"],
        sampler_logprobs=tensors["old_logprobs"].clone(),  # kept apart: the trainer may replace old_logprobs
    )
