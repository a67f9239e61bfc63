"""The envs of a rollout engine: a factory of fresh envs, a pool that reuses them, and the seeds of their resets.

Example:
    >>> pool = EnvPool(make_env_factory("RAPO-Math-v0", {"num_tasks": 2, "sandbox": "subprocess"}))
    >>> env = pool.acquire(); pool.release(env)
    >>> pool.acquire() is env, len(pool.tasks)
    (True, 2)
    >>> pool.close()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

EnvFactory = Callable[[], gym.Env]


def make_env_factory(
    env: str | EnvFactory,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
) -> EnvFactory:
    """A factory of fresh envs: a registered id (``gym.make(id, **env_kwargs)``) or a callable, then ``wrappers``."""
    if isinstance(env, str):
        import rapo_env  # noqa: F401  (registers rapo's envs)

        env_id, kwargs = env, dict(env_kwargs or {})

        def base() -> gym.Env:
            return gym.make(env_id, disable_env_checker=True, **kwargs)
    elif callable(env):
        if env_kwargs:
            raise ValueError("env_kwargs only apply to a registered env id; bind them in your factory")
        base = env
    else:
        raise TypeError(f"env must be a registered id or a callable returning an env, not {type(env).__name__}")

    def factory() -> gym.Env:
        made = base()
        for wrapper in wrappers:
            made = wrapper(made)
        return made

    return factory


def derive_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (splitmix64-style mixing)."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value ^ (int(part) & 0xFFFF_FFFF_FFFF_FFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFF_FFFF_FFFF_FFFF
        value ^= value >> 31
    return value & 0x7FFF_FFFF_FFFF_FFFF


class EnvPool:
    """Envs made by ``factory``, handed out one per running episode and reused across episodes and runs.

    Args:
        factory: builds a fresh env (wrappers included), e.g. `make_env_factory`'s.
    """

    def __init__(self, factory: EnvFactory):
        self.factory = factory
        self._free: list[gym.Env] = []
        self._all: list[gym.Env] = []

    def acquire(self) -> gym.Env:
        """A free env, or a new one when none is free."""
        if self._free:
            return self._free.pop()
        env = self.factory()
        self._all.append(env)
        return env

    def release(self, env: gym.Env | None) -> None:
        """Give ``env`` back for the next episode (None: nothing to give back)."""
        if env is not None:
            self._free.append(env)

    @property
    def tasks(self) -> Sequence[Any]:
        """The env's task list (``env.unwrapped.tasks``), read from a pooled env.

        Raises:
            AttributeError: for an env without a task list.
        """
        env = self.acquire()
        try:
            tasks = getattr(env.unwrapped, "tasks", None)
        finally:
            self.release(env)
        if tasks is None:
            raise AttributeError("this env has no task list (env.unwrapped.tasks)")
        return tasks

    def close(self) -> None:
        """Close every env the pool made."""
        for env in self._all:
            env.close()
        self._all.clear()
        self._free.clear()
