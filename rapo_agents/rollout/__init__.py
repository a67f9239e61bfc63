"""The rollout engine: groups of rollouts, batched generation, concurrent tools, token in, token out.

- `RolloutEngine` / `RolloutStats` (`rapo_agents.rollout.engine`): runs episodes and returns
  `rapo_env.trajectory.Trajectory` records (write them with `rapo_env.trajectory.write_jsonl`);
- `RolloutConfig` (`rapo_agents.rollout.config`): its settings, also the trainer's ``rollout`` section;
- `Episode` / `EpisodeRecord` (`rapo_agents.rollout.episode`): one running episode's state and tokens;
- `collate_trajectories` (`rapo_agents.rollout.collate`): padded tensors for a trainer;
- `step_entropies` (`rapo_agents.rollout.entropy`): one step's spec §5 entropies, by `rapo_agents.rapo`'s
  `step_entropy_paper` and `step_entropy_reference`.

Example:
    >>> from rapo_agents.rollout import RolloutConfig
    >>> RolloutConfig(rollout_n=16).rollout_n
    16
"""

from rapo_agents.rollout.collate import collate_trajectories
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.engine import RolloutEngine, RolloutStats, derive_seed, make_env_factory
from rapo_agents.rollout.entropy import step_entropies
from rapo_agents.rollout.episode import Episode, EpisodeRecord

__all__ = [
    "Episode",
    "EpisodeRecord",
    "RolloutConfig",
    "RolloutEngine",
    "RolloutStats",
    "collate_trajectories",
    "derive_seed",
    "make_env_factory",
    "step_entropies",
]
