"""From trajectories to the padded tensors of one RAPO update (spec §5-7).

`retrieval_terms` turns each trajectory's step entropies and retrieval marks into ``Z_ret``
(§5) and counts its retrieved tokens for ``F_ret`` (§7); `collate` pads token ids, loss masks
and rollout log-probs into a `TrainBatch` whose advantages come from `rapo_advantages` (§6).

Example:
    >>> from rapo_env.trajectory import StepRecord, Trajectory
    >>> def rollout(index, reward):
    ...     step = StepRecord(action="a", observation="", token_start=2, token_end=4, entropy_paper=1.0)
    ...     return Trajectory(task_id="q", rollout_index=index, question="q", system_prompt="", prompt="q",
    ...                       steps=[step], reward=reward, metrics={}, num_tool_calls=0, end_reason="answer",
    ...                       source="example", token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
    ...                       logprobs=[0.0, 0.0, -0.5, -0.7], prompt_length=2)
    >>> batch = collate([rollout(0, 1.0), rollout(1, 0.0)], group_index=[0, 0], pad_token_id=0)
    >>> batch.input_ids.shape, [round(a, 3) for a in batch.advantages.tolist()]
    (torch.Size([2, 4]), [0.707, -0.707])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from rapo_agents.rapo import RAPOConfig, rapo_advantages, retrieval_entropy_pairs, retrieval_reward
from rapo_env.trajectory import Trajectory

RETRIEVAL_TOKENS_KEY = "retrieval_tokens"
"""``Trajectory.extra`` key the rollout engine fills with the number of spliced retrieval tokens."""


@dataclasses.dataclass
class RetrievalTerms:
    """Per-trajectory inputs of RAPO's retrieval reward and shaping."""

    z_ret: torch.Tensor
    """``[N]`` retrieval reward ``Z_ret`` (0 without retrievals)."""
    f_ret: torch.Tensor
    """``[N]`` share of response tokens that were spliced retrieval text."""
    retrievals: torch.Tensor
    """``[N]`` number of splices."""


def step_entropy(step, estimator: str) -> float | None:
    """The step's entropy under the chosen estimator (``paper`` or ``reference``)."""
    return step.entropy_paper if estimator == "paper" else step.entropy_reference


def retrieval_terms(trajectories: Sequence[Trajectory], estimator: str = "paper") -> RetrievalTerms:
    """``Z_ret``, ``F_ret`` and retrieval counts of each trajectory (spec §5, §7).

    A retrieval recorded on step ``s`` was spliced into the observation after that step, so
    ``H_pre = H(s)`` and ``H_post = H(s + 1)``. A step without an entropy (a backend that gave
    none) invalidates the retrievals around it rather than inventing a value.
    """
    count = len(trajectories)
    width = max((len(t.steps) for t in trajectories), default=0) or 1
    entropies = torch.zeros(count, width, dtype=torch.float64)
    step_mask = torch.zeros(count, width, dtype=torch.bool)
    marks = torch.zeros(count, width, dtype=torch.bool)
    retrieved_tokens = torch.zeros(count, dtype=torch.float64)
    response_tokens = torch.ones(count, dtype=torch.float64)
    for row, trajectory in enumerate(trajectories):
        for column, step in enumerate(trajectory.steps):
            value = step_entropy(step, estimator)
            if value is not None:
                entropies[row, column] = float(value)
                step_mask[row, column] = True
            marks[row, column] = step.retrieval is not None
        retrieved_tokens[row] = float(trajectory.extra.get(RETRIEVAL_TOKENS_KEY, 0))
        if trajectory.token_ids is not None:
            response_tokens[row] = max(1, len(trajectory.token_ids) - (trajectory.prompt_length or 0))
    h_pre, h_post, valid = retrieval_entropy_pairs(entropies, step_mask, marks)
    return RetrievalTerms(
        z_ret=retrieval_reward(h_pre, h_post, valid).float(),
        f_ret=(retrieved_tokens / response_tokens).float(),
        retrievals=marks.sum(-1),
    )


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
    """``[B, T]`` log-probs of the tokens under the rollout policy (0 off the loss mask)."""
    advantages: torch.Tensor
    """``[B]`` RAPO advantage of each rollout."""
    f_ret: torch.Tensor
    """``[B]`` retrieved-token fraction."""
    rewards: torch.Tensor
    """``[B]`` outcome rewards."""
    z_ret: torch.Tensor
    """``[B]`` retrieval rewards."""
    prompt_lengths: torch.Tensor
    """``[B]`` tokens of each prompt."""

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` real tokens of each row."""
        return self.attention_mask.sum(-1)

    def select(self, rows: torch.Tensor | Sequence[int]) -> TrainBatch:
        """The rows ``rows``, re-padded to their own longest length."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[rows].max().item()) if len(rows) else 0
        return TrainBatch(**{
            field.name: (value[rows, :width] if value.dim() == 2 else value[rows])
            for field in dataclasses.fields(self)
            for value in [getattr(self, field.name)]
        })

    def to(self, device: torch.device | str) -> TrainBatch:
        """The same batch on ``device``."""
        return TrainBatch(**{field.name: getattr(self, field.name).to(device) for field in dataclasses.fields(self)})


def collate(
    trajectories: Sequence[Trajectory],
    group_index: Sequence[int],
    pad_token_id: int,
    config: RAPOConfig | None = None,
    retrieval: RetrievalTerms | None = None,
) -> TrainBatch:
    """Pad trajectories into a `TrainBatch` with RAPO advantages computed per group (spec §6).

    Raises:
        ValueError: when a trajectory lacks token ids, loss mask or log-probs, or they disagree in length.
    """
    config = config or RAPOConfig()
    if len(trajectories) != len(group_index):
        raise ValueError(f"{len(trajectories)} trajectories but {len(group_index)} group indices")
    if not trajectories:
        raise ValueError("no trajectories to collate")
    for trajectory in trajectories:
        ids, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
        if ids is None or mask is None or logprobs is None:
            raise ValueError(f"trajectory {trajectory.task_id}/{trajectory.rollout_index} has no token-level record")
        if not len(ids) == len(mask) == len(logprobs):
            raise ValueError(
                f"trajectory {trajectory.task_id}/{trajectory.rollout_index}: token_ids, loss_mask and logprobs "
                f"have lengths {len(ids)}, {len(mask)}, {len(logprobs)}"
            )
    retrieval = retrieval or retrieval_terms(trajectories, config.entropy_estimator)
    width = max(len(t.token_ids) for t in trajectories)
    count = len(trajectories)
    input_ids = torch.full((count, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros(count, width, dtype=torch.long)
    loss_mask = torch.zeros(count, width, dtype=torch.float32)
    old_logprobs = torch.zeros(count, width, dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        length = len(trajectory.token_ids)
        input_ids[row, :length] = torch.tensor(trajectory.token_ids, dtype=torch.long)
        attention[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        old_logprobs[row, :length] = torch.tensor(trajectory.logprobs, dtype=torch.float32)
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    advantages = rapo_advantages(
        rewards, retrieval.z_ret, torch.as_tensor(group_index, dtype=torch.long), config.advantage_weight, config.eps
    )
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=advantages,
        f_ret=retrieval.f_ret,
        rewards=rewards,
        z_ret=retrieval.z_ret,
        prompt_lengths=torch.tensor([t.prompt_length or 0 for t in trajectories], dtype=torch.long),
    )
