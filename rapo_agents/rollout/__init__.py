"""The rollout engine: groups of rollouts, batched generation, concurrent tools, token in, token out.

- `RolloutEngine` / `RolloutConfig` / `RolloutStats` (`rapo_agents.rollout.engine`): runs episodes and
  returns `rapo_env.trajectory.Trajectory` records (write them with `rapo_env.trajectory.write_jsonl`);
- `collate_trajectories` (`rapo_agents.rollout.collate`): padded tensors for a trainer;
- `step_entropies` (`rapo_agents.rollout.entropy`): one step's spec §5 entropies, by `rapo_agents.rapo`'s
  `step_entropy_paper` and `step_entropy_reference`.

Example:
    >>> from rapo_agents.rollout import RolloutConfig
    >>> RolloutConfig(group_size=16).group_size
    16
"""

from rapo_agents.rollout.collate import collate_trajectories
from rapo_agents.rollout.engine import RolloutConfig, RolloutEngine, RolloutStats, derive_seed, make_env_factory
from rapo_agents.rollout.entropy import step_entropies

__all__ = [
    "RolloutConfig",
    "RolloutEngine",
    "RolloutStats",
    "collate_trajectories",
    "derive_seed",
    "make_env_factory",
    "step_entropies",
]
