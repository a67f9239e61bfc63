"""Padded tensors of a list of trajectories, for any trainer (right padding).

`collate_trajectories` returns a dict with these keys (B trajectories, T longest token
context, S most steps):

=========================  ===========  =========================================================
key                        shape/dtype  meaning
=========================  ===========  =========================================================
``input_ids``              [B, T] long  prompt, policy turns, observations; ``pad_token_id`` after
``attention_mask``         [B, T] long  1 on real tokens
``loss_mask``              [B, T] f32   1 on policy-generated tokens only
``old_logprobs``           [B, T] f32   rollout log-prob of each token (0 off ``loss_mask``)
``retrieval_mask``         [B, T] bool  tokens of spliced retrieval text
``rewards``                [B] f32      outcome reward
``group_ids``              [B] long     question group (``extra["group_index"]``, else by task id)
``rollout_index``          [B] long     index within the group
``prompt_lengths``         [B] long     tokens of the templated prompt
``response_lengths``       [B] long     tokens after the prompt
``num_tool_calls``         [B] long     tool calls of the episode
``retrieval_tokens``       [B] long     spliced retrieval tokens (numerator of ``F_ret``)
``step_mask``              [B, S] bool  real steps
``step_entropy_paper``     [B, S] f32   spec §5 paper estimator (NaN when missing)
``step_entropy_reference`` [B, S] f32   spec §5 reference estimator (NaN when missing)
``step_retrieved``         [B, S] bool  a retrieval was spliced after this step
=========================  ===========  =========================================================

Example:
    >>> from rapo_env.trajectory import StepRecord, Trajectory
    >>> step = StepRecord(action="a", observation="", token_start=2, token_end=4, entropy_paper=0.5)
    >>> t = Trajectory(task_id="q", rollout_index=0, question="q", system_prompt="", prompt="q", steps=[step],
    ...                reward=1.0, metrics={}, num_tool_calls=0, end_reason="answer", source="x",
    ...                token_ids=[7, 8, 9, 10], loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -0.1, -0.2], prompt_length=2)
    >>> batch = collate_trajectories([t], pad_token_id=0)
    >>> batch["loss_mask"].tolist(), batch["step_entropy_paper"].tolist()
    ([[0.0, 0.0, 1.0, 1.0]], [[0.5]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from rapo_env.trajectory import Trajectory


def _token_rows(trajectories: Sequence[Trajectory]) -> None:
    for t in trajectories:
        if t.token_ids is None or t.loss_mask is None or t.logprobs is None:
            raise ValueError(f"trajectory {t.task_id}/{t.rollout_index} has no token-level record "
                             "(it was not produced by the rollout engine)")
        if not len(t.token_ids) == len(t.loss_mask) == len(t.logprobs):
            raise ValueError(f"trajectory {t.task_id}/{t.rollout_index}: token_ids, loss_mask and logprobs have "
                             f"lengths {len(t.token_ids)}, {len(t.loss_mask)}, {len(t.logprobs)}")


def group_ids_of(trajectories: Sequence[Trajectory]) -> list[int]:
    """Group of each trajectory: ``extra["group_index"]`` when all have it, else by first appearance of task id."""
    if all("group_index" in t.extra for t in trajectories):
        return [int(t.extra["group_index"]) for t in trajectories]
    order: dict[str, int] = {}
    return [order.setdefault(t.task_id, len(order)) for t in trajectories]


def collate_trajectories(trajectories: Sequence[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad trajectories into the tensors listed in the module docstring.

    Raises:
        ValueError: for an empty list, or a trajectory without a consistent token-level record.
    """
    if not trajectories:
        raise ValueError("no trajectories to collate")
    _token_rows(trajectories)

    def pad(rows, dtype, value=0):
        return pad_sequence([torch.tensor(r, dtype=dtype) for r in rows], batch_first=True, padding_value=value)

    lengths = [len(t.token_ids) for t in trajectories]
    retrieval_rows = []
    for t, length in zip(trajectories, lengths, strict=True):
        row = torch.zeros(length, dtype=torch.bool)
        for start, end in t.extra.get("retrieval_token_spans", []):
            row[start:end] = True
        retrieval_rows.append(row)
    steps = max(1, max(len(t.steps) for t in trajectories))

    def step_table(value_of, dtype, fill):
        table = torch.full((len(trajectories), steps), fill, dtype=dtype)
        for row, t in enumerate(trajectories):
            for column, step in enumerate(t.steps):
                value = value_of(step)
                if value is not None:
                    table[row, column] = value
        return table

    def as_long(values):
        return torch.tensor(values, dtype=torch.long)

    return {
        "input_ids": pad([t.token_ids for t in trajectories], torch.long, pad_token_id),
        "attention_mask": pad([[1] * n for n in lengths], torch.long),
        "loss_mask": pad([t.loss_mask for t in trajectories], torch.float32),
        "old_logprobs": pad([t.logprobs for t in trajectories], torch.float32),
        "retrieval_mask": pad_sequence(retrieval_rows, batch_first=True, padding_value=False),
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "group_ids": as_long(group_ids_of(trajectories)),
        "rollout_index": as_long([t.rollout_index for t in trajectories]),
        "prompt_lengths": as_long([t.prompt_length or 0 for t in trajectories]),
        "response_lengths": as_long([n - (t.prompt_length or 0) for t, n in zip(trajectories, lengths, strict=True)]),
        "num_tool_calls": as_long([t.num_tool_calls for t in trajectories]),
        "retrieval_tokens": as_long([int(t.extra.get("retrieval_tokens", 0)) for t in trajectories]),
        "step_mask": step_table(lambda s: True, torch.bool, False),
        "step_entropy_paper": step_table(lambda s: s.entropy_paper, torch.float32, math.nan),
        "step_entropy_reference": step_table(lambda s: s.entropy_reference, torch.float32, math.nan),
        "step_retrieved": step_table(lambda s: s.retrieval is not None, torch.bool, False),
    }
