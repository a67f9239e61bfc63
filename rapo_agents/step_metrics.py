"""The metrics of one training step: outcomes and behaviour of its rollouts, the mechanism of RAPO's splices
(the paper's Fig. 3-4), and the rollout engine's timing and throughput."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rapo_agents.batch import TrainBatch
from rapo_agents.rollout import RolloutStats
from rapo_env.rewards.text import FORMAT_PENALTY
from rapo_env.trajectory import Trajectory

STEP_PHASES = {"rollout": "time/rollout_s", "generate": "time/generate_s", "tools": "time/env_step_s",
               "update": "time/update_s", "sync": "time/sync_s"}
"""The phases of a training step (`rapo_agents.metrics.PhaseTimer`) and the step metric that times each."""

def rollout_metrics(trajectories: Sequence[Trajectory], batch: TrainBatch,
                    hybrid_from: int | None = None) -> dict[str, float]:
    """Outcome and behaviour statistics of one step's rollouts.

    ``hybrid_from`` is the first rollout index of a group that may retrieve (``no_retrieve_first_k``; None
    without retrieval). The ``mechanism/*`` keys compare spliced rollouts with the others (the paper's Fig. 3-4):
    reward, advantage, response tokens and tool calls of each, the advantage of the correct unspliced rollouts,
    and the step entropy before and after a splice.
    """
    rewards = batch.rewards.double()
    accuracy = torch.tensor([float(t.metrics.get("accuracy", t.metrics.get("em", 0.0))) for t in trajectories])
    format_ok = torch.tensor([float(t.metrics.get("format_ok", 0.0)) for t in trajectories])
    tool_calls = torch.tensor([float(t.num_tool_calls) for t in trajectories])
    response_tokens = (batch.lengths - batch.prompt_lengths).double()
    answered = torch.tensor([float(t.end_reason == "answer") for t in trajectories])
    retrievals = batch.retrievals.double()
    with_retrieval = retrievals > 0

    def mean_where(values: torch.Tensor) -> float:
        return float(values[with_retrieval].double().mean()) if with_retrieval.any() else 0.0

    def mean_of(values: torch.Tensor, rows: torch.Tensor) -> float:
        chosen = values[rows].double()
        chosen = chosen[~chosen.isnan()]
        return float(chosen.mean()) if len(chosen) else float("nan")

    hybrid = torch.tensor([hybrid_from is not None and t.rollout_index >= hybrid_from for t in trajectories])
    mechanism = {}
    for name, rows in (("spliced", with_retrieval), ("unspliced", ~with_retrieval)):
        mechanism.update({f"mechanism/{name}_reward": mean_of(rewards, rows),
                          f"mechanism/{name}_advantage": mean_of(batch.advantages, rows),
                          f"mechanism/{name}_response_tokens": mean_of(response_tokens, rows),
                          f"mechanism/{name}_tool_calls": mean_of(tool_calls, rows)})
    # What the policy's own behaviour (what a test episode runs) is told: the advantage of its correct rollouts.
    # Spliced rollouts that score higher raise the group mean, and with it lower this (GRPO's is the same
    # rollouts' advantage without any splice in their groups).
    mechanism["mechanism/correct_unspliced_advantage"] = mean_of(batch.advantages, ~with_retrieval & (accuracy > 0))
    mechanism.update({"mechanism/entropy_before_splice": mean_of(batch.entropy_pre, with_retrieval),
                      "mechanism/entropy_after_splice": mean_of(batch.entropy_post, with_retrieval),
                      # Of the rollouts allowed to retrieve, the share that got at least one splice.
                      "retrieval/hybrid_splice_rate": mean_of(with_retrieval.double(), hybrid)})
    return {**mechanism,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "advantage/mean": float(batch.advantages.mean()),
        "advantage/abs_mean": float(batch.advantages.abs().mean()),
        # Rollouts whose reward is above the format penalty's floor: the only ones that can carry a gradient
        # when the rest of their group sits at the floor.
        "reward/above_penalty_rate": float((rewards > rewards.new_tensor(FORMAT_PENALTY)).double().mean()),
        "accuracy": float(accuracy.mean()),
        "format_rate": float(format_ok.mean()),
        "answered_rate": float(answered.mean()),
        "tool_calls/mean": float(tool_calls.mean()),
        "response_tokens/mean": float(response_tokens.mean()),
        "retrieval/count_mean": float(retrievals.mean()),
        "retrieval/rollouts_with_retrieval": float(with_retrieval.double().mean()),
        "retrieval/z_ret_mean": mean_where(batch.z_ret),
        "retrieval/f_ret_mean": mean_where(batch.f_ret),
    }


def engine_metrics(stats: RolloutStats, rollout_seconds: float, episodes: int) -> dict[str, float]:
    """Where one step's rollout time went (generation, env steps) and how fast it ran."""
    return {
        "time/rollout_s": rollout_seconds,
        "time/generate_s": stats.generate_s,
        "time/env_step_s": stats.env_step_s,
        # the rollout's waits for tools with nothing to decode, or still running when their episode was due to
        # rejoin the batch (`RolloutConfig.rejoin_delay_steps`)
        "time/tool_wait_s": stats.wait_s,
        "throughput/generate_tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
        "throughput/episodes_per_s": episodes / max(rollout_seconds, 1e-9),
        "rollout/branches": float(stats.branches),
        "rollout/refills": float(stats.refills),
        "retrieval/skipped_splices": float(stats.skipped_splices),
    }


def prefill_snapshot(policy: object) -> dict[str, float] | None:
    """The policy's running prefill counts (`FastPolicy.prefill_stats`), or None for a policy without a prefix
    cache."""
    stats = getattr(policy, "prefill_stats", None)
    return stats.as_dict() if stats is not None else None


def prefill_metrics(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """What one step's rollouts prefilled and took from the prefix KV cache, from two `prefill_snapshot` results.

    Example:
        >>> prefill_metrics({"prompt_tokens": 100, "prefilled_tokens": 100, "reused_tokens": 0},
        ...                 {"prompt_tokens": 400, "prefilled_tokens": 160, "reused_tokens": 280})
        {'rollout/prefill_tokens': 60.0, 'rollout/prefix_reused_fraction': 0.9333333333333333}
    """
    if before is None or after is None:
        return {}
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    return {"rollout/prefill_tokens": float(after["prefilled_tokens"] - before["prefilled_tokens"]),
            "rollout/prefix_reused_fraction": (after["reused_tokens"] - before["reused_tokens"]) / prompt
            if prompt else 0.0}
