"""A trainer right after its supervised warm-up: the policy that benchmarks of evaluation and rollouts decode with.

An untrained SmolLM2 rarely calls a tool, so a workload of its episodes would not exercise tools at all; the
warm-up (a few supervised steps on expert episodes, the first phase of every `rapo train`) gives the policy that
the run's rollouts and evaluations really decode with.
"""

from __future__ import annotations

from pathlib import Path

from rapo_agents.config import load_config
from rapo_agents.rollout.engine import make_env_factory
from rapo_agents.trainer import RAPOTrainer, training_env_kwargs
from rapo_agents.warmup import warm_up


def warmed_up_trainer(config_path: str | Path, output_dir: str, overrides: list[str] = ()) -> RAPOTrainer:
    """The trainer of ``config_path`` (with ``overrides``, quiet, writing to ``output_dir``) after its warm-up,
    its rollout policy in sync."""
    config = load_config(config_path, ["logging.progress=false", "logging.tensorboard=false",
                                       f"logging.output_dir={output_dir}", *overrides])
    trainer = RAPOTrainer(config)
    make_env = make_env_factory(config.data.env_id, training_env_kwargs(config))
    warm_up(trainer.model, trainer.tokenizer, make_env, config.warmup, config.rollout, config.optim, trainer.control,
            seed=config.seed, autocast_dtype=trainer.autocast_dtype)
    trainer.sync_policy()
    return trainer
