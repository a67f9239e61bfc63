"""Agents for rapo: policies, the rollout engine, the RAPO algorithm, the trainer and evaluation.

The main names import from the package itself, lazily: ``import rapo_agents`` loads none of them (and never
vLLM, Ray or a model); each is imported on first use from the module that defines it.

- policies (`rapo_agents.policies`): `HFPolicy`, `VLLMPolicy`, `OpenAIPolicy`, `ScriptedPolicy`, `Policy`,
  `SamplingParams`, `Generation`;
- the rollout engine (`rapo_agents.rollout`): `RolloutEngine`, `RolloutConfig`, `Episode`, `collate_trajectories`;
- the RAPO algorithm, pure torch functions in paper order (`rapo_agents.rapo`): `RAPOConfig`,
  `step_entropy_paper`, `step_entropy_reference`, `retrieval_entropy_pairs`, `retrieval_reward`,
  `group_normalize`, `fused_advantage`, `rapo_advantages`, `retrieval_fraction`, `rapo_policy_loss`, ...;
- training (`rapo_agents.trainer`, `rapo_agents.config`, `rapo_agents.config_loader`): `RAPOTrainer`,
  `TrainConfig`, `load_config`;
- evaluation (`rapo_agents.evaluation`): `evaluate`, `EvalConfig`.

Example:
    >>> from rapo_agents import RolloutConfig, rapo_advantages
    >>> RolloutConfig(rollout_n=16).rollout_n
    16
"""

from __future__ import annotations

import importlib
from typing import Any

_RAPO_FUNCTIONS = (
    "RAPOConfig", "LossOutput", "masked_mean", "token_entropy_from_logits", "step_entropy_paper",
    "topk_token_entropy", "step_entropy_reference", "retrieval_entropy_pairs", "retrieval_reward",
    "group_normalize", "fused_advantage", "rapo_advantages", "retrieval_fraction", "k3_kl", "rapo_policy_loss",
)

_LAZY: dict[str, str] = {
    **{name: "rapo_agents.policies" for name in (
        "HFPolicy", "VLLMPolicy", "OpenAIPolicy", "ScriptedPolicy", "Policy", "SamplingParams", "Generation")},
    **{name: "rapo_agents.rollout" for name in (
        "RolloutEngine", "RolloutConfig", "RolloutStats", "Episode", "collate_trajectories")},
    **{name: "rapo_agents.rapo" for name in _RAPO_FUNCTIONS},
    "RAPOTrainer": "rapo_agents.trainer",
    "TrainConfig": "rapo_agents.config",
    "load_config": "rapo_agents.config_loader",
    "evaluate": "rapo_agents.evaluation",
    "EvalConfig": "rapo_agents.evaluation",
}
"""Public name -> the module that defines (or re-exports) it."""

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
