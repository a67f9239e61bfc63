"""rapo's Gymnasium environments, task sources, rewards and wrappers (the Env layer).

It holds `ToolEnv` (`rapo_env.core`, the base class of every rapo env: text in, text out, tools called by
tags), the registered envs ``RAPO-Math-v0``, ``RAPO-Web-v0`` and ``RAPO-QA-v0`` (`rapo_env.envs`), their task
sources (`rapo_env.tasks`) and scorers (`rapo_env.rewards`), the `Trajectory` record every rollout writes
(`rapo_env.trajectory`) and the wrappers (`rapo_env.wrappers`), chief among them `StepTraceRetrievalWrapper`,
which splices retrieved step traces into hybrid rollouts; `create_rapo_app` serves any of these envs over the
OpenEnv protocol (`rapo_env.openenv_server`) and `RemoteEnv` makes a served env a ``gym.Env`` again
(`rapo_env.remote`). It uses `rapo_tools` and `rapo_buffers` and knows no policy or trainer.

Importing the package registers the environments (lazy string entry points); the wrapper and the trajectory
record are imported on first use:

    >>> import gymnasium as gym
    >>> import rapo_env
    >>> "RAPO-Math-v0" in gym.registry
    True
    >>> from rapo_env import StepTraceRetrievalWrapper, ToolEnv
    >>> issubclass(StepTraceRetrievalWrapper, gym.Wrapper) and issubclass(ToolEnv, gym.Env)
    True
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from rapo_env.core import ToolEnv

RAPO_ENV_IDS: list[str] = []

_LAZY = {
    "StepTraceRetrievalWrapper": "rapo_env.wrappers.retrieval",
    "StepRecord": "rapo_env.trajectory",
    "Trajectory": "rapo_env.trajectory",
    "read_jsonl": "rapo_env.trajectory",
    "write_jsonl": "rapo_env.trajectory",
    "RemoteEnv": "rapo_env.remote",  # these two need the openenv extra
    "create_rapo_app": "rapo_env.openenv_server",
}
"""Public name -> its module, imported on first use."""


def _register(env_id: str, entry_point: str, **options) -> None:
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, **options)
    RAPO_ENV_IDS.append(env_id)


_register("RAPO-Math-v0", "rapo_env.envs.math:MathEnv")
_register("RAPO-Web-v0", "rapo_env.envs.web:WebEnv", nondeterministic=True)
_register("RAPO-QA-v0", "rapo_env.envs.qa:QAEnv")

__all__ = ["RAPO_ENV_IDS", "ToolEnv", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
