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
engine's scheduler (`_Run`) only moves episodes between three queues: waiting to start, ready for the
policy, and stepping their env in the thread pool.

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
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rapo_agents.policies.base import Generation, Policy, SamplingParams
from rapo_agents.rollout.branching import ARPOConfig, branch_count, initial_reserves, split_reserve
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.entropy import turn_entropy
from rapo_agents.rollout.episode import Episode
from rapo_env.core import copy_episode
from rapo_env.protocol import closing_tags
from rapo_env.trajectory import Trajectory

EnvFactory = Callable[[], gym.Env]


@dataclasses.dataclass
class RolloutStats:
    """Where the time of the last `RolloutEngine.run` went."""

    episodes: int = 0
    wall_s: float = 0.0
    generate_s: float = 0.0
    """Time inside ``policy.generate`` (the main thread)."""
    env_step_s: float = 0.0
    """Summed time of all env steps (tool calls, retrieval), across threads."""
    wait_s: float = 0.0
    """Time the main thread waited for env steps with nothing to generate."""
    generate_calls: int = 0
    generated_tokens: int = 0
    tool_calls: int = 0
    branches: int = 0
    """ARPO: rollouts that branched off another one after a tool result."""
    refills: int = 0
    """ARPO: rollouts started from the prompt because a rollout ended before its share of the group was used."""
    skipped_splices: int = 0
    """Retrieval splices left out because they did not fit the response budget (spec §4)."""

    @property
    def generation_share(self) -> float:
        """Share of wall time spent generating."""
        return self.generate_s / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict[str, float]:
        data = dataclasses.asdict(self)
        data["generation_share"] = self.generation_share
        data["episodes_per_s"] = self.episodes / self.wall_s if self.wall_s else 0.0
        data["tool_calls_per_s"] = self.tool_calls / self.wall_s if self.wall_s else 0.0
        data["tokens_per_s"] = self.generated_tokens / self.generate_s if self.generate_s else 0.0
        return data


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
        self.policy = policy
        self.config = config or RolloutConfig()
        self.arpo = arpo or ARPOConfig()
        self.tokenizer = policy.tokenizer
        self.vocab_size = int(getattr(policy, "vocab_size", None) or len(self.tokenizer))
        self.source = getattr(policy, "name", type(policy).__name__)
        self.stats = RolloutStats()
        self._free_envs: list[gym.Env] = []
        self._all_envs: list[gym.Env] = []
        self._pool: cf.ThreadPoolExecutor | None = None

    # ---- public ------------------------------------------------------------------------------------

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
        run = _Run(self, self._first_episodes(task_indices, group_size), seed, on_trajectory)
        started = time.perf_counter()
        try:
            while run.active:
                run.start_waiting()
                run.collect_env_steps()
                if run.may_generate():
                    run.generate()
        finally:
            run.close()
            self.stats.wall_s = time.perf_counter() - started
        return run.trajectories()

    def sync_weights(self, source: Any) -> bool:
        """Bring the policy up to date with ``source`` (a module or a state dict); False when it has nothing to
        sync (it shares the trainer's module, or keeps no weights)."""
        sync = getattr(self.policy, "sync_weights", None)
        return bool(sync(source)) if sync is not None else False

    @property
    def tasks(self) -> Sequence[Any]:
        """The env's task list (``env.unwrapped.tasks``), read from a pooled env."""
        env = self._acquire_env()
        try:
            tasks = getattr(env.unwrapped, "tasks", None)
        finally:
            self._free_envs.append(env)
        if tasks is None:
            raise AttributeError("this env has no task list (env.unwrapped.tasks)")
        return tasks

    def close(self) -> None:
        """Close the pooled envs and the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for env in self._all_envs:
            env.close()
        self._all_envs.clear()
        self._free_envs.clear()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- episodes --------------------------------------------------------------------------------------

    def _first_episodes(self, task_indices: Sequence[int], group_size: int) -> list[Episode]:
        """The episodes that start from the prompt: G per task, or ARPO's M per task with their reserves."""
        if self.arpo.enabled(group_size):
            reserves = initial_reserves(group_size, self.arpo.initial_rollouts)
            return [Episode(int(q), i, g, reserve=list(reserve))
                    for g, q in enumerate(task_indices) for i, reserve in enumerate(reserves)]
        return [Episode(int(q), i, g) for g, q in enumerate(task_indices) for i in range(group_size)]

    def _executor(self) -> cf.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(self.config.tool_workers, thread_name_prefix="rapo-rollout")
        return self._pool

    def _acquire_env(self) -> gym.Env:
        if self._free_envs:
            return self._free_envs.pop()
        env = self.env_factory()
        self._all_envs.append(env)
        return env

    def _release(self, episode: Episode) -> None:
        if episode.env is not None:
            self._free_envs.append(episode.env)
            episode.env = None

    def _start(self, episode: Episode, seed: int, parent: Episode | None = None) -> None:
        """Reset a pooled env for ``episode``; a branch then continues its ``parent``'s episode and token record."""
        episode.env = env = self._acquire_env()
        prompt, info = env.reset(
            seed=derive_seed(seed, episode.task_index, episode.rollout_index),
            options={"task_index": episode.task_index, "rollout_index": episode.rollout_index},
        )
        task = getattr(env.unwrapped, "task", None)
        if parent is not None:
            copy_episode(parent.env, env)
            episode.prompt, episode.reset_info = prompt, dict(info)
            episode.question = getattr(task, "question", prompt)
            episode.continue_from(parent)
            return
        episode.begin(prompt, info, self.tokenizer, self.config.max_prompt_tokens, self.config.max_response_tokens,
                      question=getattr(task, "question", prompt))

    def _stop_strings(self, episode: Episode) -> tuple[str, ...]:
        if self.config.stop is not None:
            return tuple(self.config.stop)
        return tuple(closing_tags(episode.reset_info.get("tools", ())))

    def _branch(self, episode: Episode, generation: Generation, seed: int) -> list[Episode]:
        """ARPO: measure the turn just generated; after a tool result, branch the rollout as its entropy says.

        The branches continue from the tool result (before this turn), each sampling the turn afresh.
        """
        arpo = self.arpo
        if generation.finish_reason == "error" or arpo.initial_rollouts is None:
            return []
        entropy = turn_entropy(generation.top_logprobs, generation.entropies if generation.entropy_kind == "full"
                               else None, self.vocab_size, arpo.entropy_tokens)
        if not episode.record.steps:  # the first turn: H_initial
            episode.initial_entropy = entropy
            return []
        if not episode.reserve or episode.record.steps[-1].tool is None:
            return []
        delta_h = 0.0 if entropy is None or episode.initial_entropy is None else entropy - episode.initial_entropy
        draws = random.Random(derive_seed(seed, episode.task_index, episode.rollout_index, episode.turn, _BRANCH))
        count = branch_count(delta_h, [draws.random() for _ in range(arpo.beam_size - 1)], arpo.entropy_weight,
                             arpo.branch_probability)
        if not count:
            return []
        episode.reserve, children = split_reserve(episode.reserve, count)
        branches = []
        for rollout_index, reserve in children:
            branch = Episode(episode.task_index, rollout_index, episode.group_index, reserve=reserve)
            self._start(branch, seed, parent=episode)
            branches.append(branch)
        self.stats.branches += len(branches)
        return branches

    def _batch_wait(self) -> float:
        if self.config.batch_wait_s is not None:
            return self.config.batch_wait_s
        calls = self.stats.generate_calls
        return 0.5 * self.stats.generate_s / calls if calls else 0.0

    def _generate(self, batch: list[Episode], seed: int) -> list[Generation]:
        config = self.config
        contexts, params = [], []
        for episode in batch:
            remaining = episode.record.remaining
            contexts.append(episode.record.token_ids)
            params.append(SamplingParams(
                temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                max_new_tokens=min(remaining, config.max_turn_tokens or remaining),
                stop=self._stop_strings(episode), top_logprobs=config.top_logprobs,
                seed=derive_seed(seed, episode.task_index, episode.rollout_index, episode.turn),
            ))
        started = time.perf_counter()
        generations = self.policy.generate(contexts, params)
        self.stats.generate_s += time.perf_counter() - started
        self.stats.generate_calls += 1
        self.stats.generated_tokens += sum(g.num_tokens for g in generations)
        return generations

    @staticmethod
    def _step_env(episode: Episode, action: str) -> tuple[Any, ...]:
        started = time.perf_counter()
        try:
            result = episode.env.step(action)
        except Exception as error:  # a broken env or wrapper ends this episode, never the run
            failure = {"episode_end": "env_error", "env_error": f"{type(error).__name__}: {error}"}
            result = ("", 0.0, False, True, failure)
        return (*result, time.perf_counter() - started)

    def _after_step(self, episode: Episode, observation: str, reward: float, terminated: bool, truncated: bool,
                    info: dict[str, Any], seconds: float) -> None:
        self.stats.env_step_s += seconds
        if info.get("tool") is not None and info.get("tool_error") != "tool_limit":
            self.stats.tool_calls += 1
        skipped = episode.record.skipped_splices
        episode.add_step(observation, reward, terminated, truncated, info)
        self.stats.skipped_splices += episode.record.skipped_splices - skipped


class _Run:
    """The scheduler of one `RolloutEngine.run`: episodes move from ``waiting`` (not started) to ``ready``
    (their turn to generate) to ``stepping`` (their env step runs in the thread pool) and back to ``ready``,
    until they end. The episodes' own state changes only inside `Episode`."""

    def __init__(self, engine: RolloutEngine, episodes: list[Episode], seed: int,
                 on_trajectory: Callable[[Trajectory], None] | None):
        self.engine, self.config, self.seed, self.on_trajectory = engine, engine.config, seed, on_trajectory
        self.episodes = list(episodes)
        self.waiting = list(reversed(episodes))
        self.ready: list[Episode] = []
        self.stepping: dict[cf.Future, Episode] = {}
        self.progress = _progress(engine.stats.episodes, self.config.show_progress)
        self.pool = engine._executor()

    @property
    def active(self) -> bool:
        return bool(self.waiting or self.ready or self.stepping)

    def start_waiting(self) -> None:
        """Start waiting episodes while fewer than ``max_concurrent_episodes`` are in flight."""
        while self.waiting and len(self.ready) + len(self.stepping) < self.config.max_concurrent_episodes:
            episode = self.waiting.pop()
            self.engine._start(episode, self.seed)
            self.ready.append(episode)

    def collect_env_steps(self) -> None:
        """Take the results of finished env steps: with ``overlap``, the fast ones while others are ready to
        generate (or the first one when none is); without it, every step of the round."""
        if not self.stepping:
            return
        if self.config.overlap and self.ready:  # let fast tools join this batch, not slow ones
            timeout, when = self.engine._batch_wait(), cf.ALL_COMPLETED
        elif self.config.overlap:
            timeout, when = None, cf.FIRST_COMPLETED
        else:  # strict rounds: every tool of the round first
            timeout, when = None, cf.ALL_COMPLETED
        wait_from = time.perf_counter()
        done, _ = cf.wait(list(self.stepping), timeout=timeout, return_when=when)
        self.engine.stats.wait_s += time.perf_counter() - wait_from
        for future in done:
            episode = self.stepping.pop(future)
            self.engine._after_step(episode, *future.result())
            self._continue(episode)

    def may_generate(self) -> bool:
        return bool(self.ready) and (self.config.overlap or not self.stepping)

    def generate(self) -> None:
        """One batched generation over the ready episodes; each then steps its env (or ends, or branches)."""
        batch, self.ready = self.ready, []
        for episode, generation in zip(batch, self.engine._generate(batch, self.seed), strict=True):
            branches = self.engine._branch(episode, generation, self.seed)
            self.episodes.extend(branches)
            self.ready.extend(branches)
            if episode.add_generation(generation, self.engine.vocab_size):
                self.stepping[self.pool.submit(self.engine._step_env, episode, generation.text)] = episode
            else:
                self._finish(episode)

    def _continue(self, episode: Episode) -> None:
        if episode.done:
            self._finish(episode)
        else:
            self.ready.append(episode)

    def _finish(self, episode: Episode) -> None:
        self.engine._release(episode)
        self.progress.update(1)
        if self.on_trajectory is not None:
            self.on_trajectory(episode.to_trajectory(self.engine.source))
        if episode.reserve:  # ARPO: the slots it did not branch into start afresh from the prompt
            refill = Episode(episode.task_index, episode.reserve[0], episode.group_index, reserve=episode.reserve[1:])
            self.episodes.append(refill)
            self.waiting.append(refill)
            self.engine.stats.refills += 1

    def close(self) -> None:
        self.progress.close()
        for future in self.stepping:
            future.cancel()

    def trajectories(self) -> list[Trajectory]:
        """Every episode's trajectory, group by group, by rollout index."""
        ordered = sorted(self.episodes, key=lambda episode: (episode.group_index, episode.rollout_index))
        return [episode.to_trajectory(self.engine.source) for episode in ordered]


_BRANCH = 0xB4A2C
"""Mixed into the seed of ARPO's branching draws, apart from the sampling seeds of the same turn."""


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rollouts", unit="ep", disable=not enabled)
