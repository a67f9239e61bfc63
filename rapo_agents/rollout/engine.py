"""`RolloutEngine`: many episodes at once, groups of G rollouts per question, token in, token out.

Each round batches one generation over every episode that waits for the policy; the
env steps of the finished generations (tool calls, retrieval) run concurrently in a
thread pool, and, with ``overlap=True``, alongside the next generation batch: tool
results that arrive within ``batch_wait_s`` (adaptive by default) join the batch, slower
ones join the next.

The i-th rollout of a group is reset with ``options={"task_index": q, "rollout_index": i}``
and a seed derived from (run seed, q, i), so results do not depend on which pooled env
or which batch served an episode. Sampling seeds are derived the same way per turn.

What each `Trajectory` holds (see `rapo_env.trajectory`): ``token_ids`` (templated prompt,
policy turns, observations), ``loss_mask`` (1 only on policy tokens), ``logprobs``
(rollout log-probs, 0 off the mask), ``prompt_length``, per step ``token_start/end``,
``entropy_paper`` and ``entropy_reference`` (spec §5) and ``retrieval`` (the wrapper's
info plus ``token_span``), and in ``extra``: ``task_index``, ``group_index``,
``retrieval_tokens``, ``retrieval_token_spans``, ``prompt_truncated``, ``skipped_splices``, ``finish_reasons``.
``end_reason`` is the env's (``answer``, ``tool_limit``, ``turn_limit``), ``length`` when
the env's own text no longer fits the response token budget, or ``policy_error``. A retrieval
splice that does not fit is skipped and the episode goes on (spec §4; `RolloutStats.skipped_splices`).

Each episode's state lives in one `rapo_agents.rollout.episode.Episode`, which alone changes it; the
scheduler of a run (`rapo_agents.rollout.scheduler.Scheduler`) only moves episodes between three queues:
waiting to start, ready for the policy, and stepping their env in the thread pool. Envs come from an
`rapo_agents.rollout.env_pool.EnvPool` and are reused across episodes and runs.

With ``config.arpo.initial_rollouts`` set, groups grow by ARPO's entropy-based branching
(`rapo_agents.rollout.branching`): a branch continues a copy of its parent's env (`rapo_env.core.copy_episode`)
and token record from a tool result; its trajectory holds the whole shared prefix and says in ``extra``
``branch_parent`` (the parent's rollout index) and ``branch_prefix_tokens`` (tokens shared with it).

Example:
    >>> import gymnasium as gym, rapo_env
    >>> from rapo_agents.policies import ScriptedPolicy
    >>> policy = ScriptedPolicy(["<python>\\nprint(2 + 2)\\n</python>", "<answer>\\\\boxed{4}</answer>"])
    >>> engine = RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(rollout_n=2),
    ...                        env_kwargs={"num_tasks": 3, "sandbox": "subprocess"})
    >>> trajectories = engine.run([0, 1])
    >>> [(t.task_id, t.rollout_index, t.num_tool_calls) for t in trajectories][:2]
    [('procmath-s0-d1-0', 0, 1), ('procmath-s0-d1-0', 1, 1)]
    >>> engine.close()
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rapo_agents.policies.base import Policy
from rapo_agents.rollout.branching import ARPOConfig, initial_reserves
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.env_pool import EnvFactory, EnvPool, derive_seed, make_env_factory
from rapo_agents.rollout.episode import Episode
from rapo_agents.rollout.scheduler import RolloutStats, RunSettings, Scheduler
from rapo_env.trajectory import Trajectory

__all__ = ["EnvFactory", "RolloutEngine", "RolloutStats", "derive_seed", "make_env_factory"]


class RolloutEngine:
    """Runs groups of rollouts of a policy in an env, token in, token out.

    Args:
        env: a registered env id or a factory returning a fresh env (wrappers included).
        policy: any `Policy`.
        config: the rollout settings (`RolloutConfig`).
        env_kwargs: ``gym.make`` keyword arguments (with an env id).
        wrappers: callables applied to each new env, e.g. ``lambda e: StepTraceRetrievalWrapper(e, retriever)``.
        arpo: ARPO-style entropy-based branching of the groups (`ARPOConfig`; None or its default: off).

    Envs are pooled and reused across episodes and runs; `close` releases them.
    """

    def __init__(
        self,
        env: str | EnvFactory,
        policy: Policy,
        config: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
        arpo: ARPOConfig | None = None,
    ):
        self.env_factory = make_env_factory(env, env_kwargs, wrappers)
        self.envs = EnvPool(self.env_factory)
        self.policy = policy
        self.config = config or RolloutConfig()
        self.arpo = arpo or ARPOConfig()
        self.tokenizer = policy.tokenizer
        self.vocab_size = int(getattr(policy, "vocab_size", None) or len(self.tokenizer))
        self.source = getattr(policy, "name", type(policy).__name__)
        self.stats = RolloutStats()
        self._pool: cf.ThreadPoolExecutor | None = None

    def run(
        self,
        task_indices: Sequence[int],
        group_size: int | None = None,
        seed: int = 0,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``group_size`` rollouts of each task; trajectories come back group by group, in order.

        Args:
            task_indices: indices into the env's task list (``reset(options={"task_index": q})``).
            group_size: G (default ``config.rollout_n``).
            seed: the run's seed: env resets, retrieval draws and sampling derive from it per episode
                (a trainer passes one per step).
            on_trajectory: called with each trajectory as soon as its episode ends (e.g. to stream JSONL).
        """
        group_size = group_size or self.config.rollout_n
        self.stats = RolloutStats(episodes=len(task_indices) * group_size)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(self.config.tool_workers, thread_name_prefix="rapo-rollout")
        settings = RunSettings(self.envs, self.policy, self.config, self.arpo, self._pool, self.vocab_size,
                               self.source)
        scheduler = Scheduler(settings, self._first_episodes(task_indices, group_size), self.stats, seed,
                              on_trajectory)
        started = time.perf_counter()
        try:
            return scheduler.run()
        finally:
            self.stats.wall_s = time.perf_counter() - started

    def sync_weights(self, source: Any) -> bool:
        """Bring the policy up to date with ``source`` (a module or a state dict); False when it has nothing to
        sync (it shares the trainer's module, or keeps no weights)."""
        sync = getattr(self.policy, "sync_weights", None)
        return bool(sync(source)) if sync is not None else False

    @property
    def tasks(self) -> Sequence[Any]:
        """The env's task list (``env.unwrapped.tasks``), read from a pooled env."""
        return self.envs.tasks

    def close(self) -> None:
        """Close the pooled envs and the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.envs.close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _first_episodes(self, task_indices: Sequence[int], group_size: int) -> list[Episode]:
        """The episodes that start from the prompt: G per task, or ARPO's M per task with their reserves."""
        if self.arpo.enabled(group_size):
            reserves = initial_reserves(group_size, self.arpo.initial_rollouts)
            return [Episode(int(q), i, g, reserve=list(reserve))
                    for g, q in enumerate(task_indices) for i, reserve in enumerate(reserves)]
        return [Episode(int(q), i, g) for g, q in enumerate(task_indices) for i in range(group_size)]
