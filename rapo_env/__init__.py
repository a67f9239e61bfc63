"""rapo's Gymnasium environments, task sources, rewards and wrappers.

Importing the package registers the environments (lazy string entry points):

    >>> import gymnasium as gym
    >>> import rapo_env
    >>> "RAPO-Math-v0" in gym.registry
    True
"""

from __future__ import annotations

import gymnasium as gym

from rapo_env.core import ToolEnv

RAPO_ENV_IDS: list[str] = []


def _register(env_id: str, entry_point: str, **options) -> None:
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, **options)
    RAPO_ENV_IDS.append(env_id)


_register("RAPO-Math-v0", "rapo_env.envs.math:MathEnv")
_register("RAPO-Web-v0", "rapo_env.envs.web:WebEnv", nondeterministic=True)
_register("RAPO-QA-v0", "rapo_env.envs.qa:QAEnv")

__all__ = ["RAPO_ENV_IDS", "ToolEnv"]
