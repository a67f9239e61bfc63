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
``retrieval_tokens``, ``retrieval_token_spans``, ``prompt_truncated``, ``finish_reasons``.
``end_reason`` is the env's (``answer``, ``tool_limit``, ``turn_limit``), ``length`` when
the response token budget ran out, or ``policy_error``.

With ``config.arpo.initial_rollouts`` set, groups grow by ARPO's entropy-based branching
(`rapo_agents.rollout.branching`): a branch continues a copy of its parent's env (`rapo_env.core.copy_episode`)
and token record from a tool result; its trajectory holds the whole shared prefix and says in ``extra``
``branch_parent`` (the parent's rollout index) and ``branch_prefix_tokens`` (tokens shared with it).

Example:
    >>> import gymnasium as gym, rapo_env
    >>> from rapo_agents.policies import ScriptedPolicy
    >>> policy = ScriptedPolicy(["<python>\\nprint(2 + 2)\\n</python>", "<answer>\\\\boxed{4}</answer>"])
    >>> engine = RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(group_size=2),
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
from rapo_agents.rollout.entropy import turn_entropy
from rapo_agents.rollout.episode import EpisodeRecord
from rapo_agents.scripted import split_spliced_text
from rapo_env.core import copy_episode
from rapo_env.protocol import closing_tags
from rapo_env.trajectory import Trajectory

EnvFactory = Callable[[], gym.Env]


@dataclasses.dataclass
class RolloutConfig:
    """Settings of a rollout run."""

    group_size: int = 1
    """G: rollouts per question (``rollout_n``); rollout i is reset with ``rollout_index=i``."""
    max_prompt_tokens: int = 1536
    """Longest templated prompt; a longer user turn is cut from the left (its question end kept)."""
    max_response_tokens: int = 4096
    """Token budget of everything after the prompt (policy turns, tool results, spliced text)."""
    max_turn_tokens: int | None = None
    """Most tokens of one policy turn (None: the rest of the response budget)."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    top_logprobs: int = 10
    """Top log-probs kept per token for the reference entropy estimator (0: skip it)."""
    stop: tuple[str, ...] | None = None
    """Stop strings; None: the closing tags of the env's tools (``info["tools"]``) and ``</answer>``."""
    seed: int = 0
    """Seed of the run: env resets, retrieval draws and sampling derive from it per episode."""
    max_concurrent_episodes: int = 64
    """Episodes in flight at once (each holds one env of the pool)."""
    tool_workers: int = 16
    """Threads that run env steps (tool calls) concurrently."""
    overlap: bool = True
    """Generate for ready episodes while other episodes' tools still run (False: strict rounds)."""
    batch_wait_s: float | None = None
    """With ``overlap``, how long to wait for running tools to join a generation batch. None: adaptive,
    half the mean duration of a generate call, so that slow generation (HF on CPU, where a batch of 8
    costs about what a batch of 1 does) is not split into small batches, while fast generation is
    not held up by slow tools."""
    show_progress: bool = False
    """Show a tqdm bar of finished episodes."""
    arpo: ARPOConfig = dataclasses.field(default_factory=ARPOConfig)
    """ARPO-style entropy-based branching of the groups (off by default)."""

    def __post_init__(self) -> None:
        for name in ("group_size", "max_prompt_tokens", "max_response_tokens", "max_concurrent_episodes",
                     "tool_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1 or None, got {self.max_turn_tokens}")
        if self.batch_wait_s is not None and self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0 or None, got {self.batch_wait_s}")


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


@dataclasses.dataclass
class _Episode:
    task_index: int
    rollout_index: int
    group_index: int
    env: gym.Env | None = None
    record: EpisodeRecord | None = None
    reset_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    prompt: str = ""
    question: str = ""
    stop: tuple[str, ...] = ()
    turn: int = 0
    reward: float = 0.0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    num_tool_calls: int = 0
    end_reason: str | None = None
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None
    reserve: list[int] = dataclasses.field(default_factory=list)
    """ARPO: the group's slots this rollout may fill with branches (or, when it ends, with fresh rollouts)."""
    initial_entropy: float | None = None
    """ARPO: H_initial, the entropy of the rollout's first turn (a branch keeps its parent's)."""
    branch_parent: int | None = None
    branch_prefix_tokens: int | None = None


class RolloutEngine:
    """Runs groups of rollouts of a policy in an env, token in, token out.

    Args:
        env: a registered env id or a factory returning a fresh env (wrappers included).
        policy: any `Policy`.
        config: the run's settings.
        env_kwargs: ``gym.make`` keyword arguments (with an env id).
        wrappers: callables applied to each new env, e.g. ``lambda e: StepTraceRetrievalWrapper(e, retriever)``.

    Envs are pooled and reused across episodes and runs; `close` releases them.
    """

    def __init__(
        self,
        env: str | EnvFactory,
        policy: Policy,
        config: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    ):
        self.env_factory = make_env_factory(env, env_kwargs, wrappers)
        self.policy = policy
        self.config = config or RolloutConfig()
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
        seed: int | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``group_size`` rollouts of each task; trajectories come back group by group, in order.

        Args:
            task_indices: indices into the env's task list (``reset(options={"task_index": q})``).
            group_size: G (default ``config.group_size``).
            seed: the run's seed (default ``config.seed``); a trainer passes one per step.
            on_trajectory: called with each trajectory as soon as its episode ends (e.g. to stream JSONL).
        """
        group_size = group_size or self.config.group_size
        seed = self.config.seed if seed is None else seed
        arpo = self.config.arpo
        if arpo.enabled(group_size):
            reserves = initial_reserves(group_size, arpo.initial_rollouts)
            episodes = [_Episode(int(q), i, g, reserve=list(reserve))
                        for g, q in enumerate(task_indices) for i, reserve in enumerate(reserves)]
        else:
            episodes = [_Episode(int(q), i, g) for g, q in enumerate(task_indices) for i in range(group_size)]
        self.stats = stats = RolloutStats(episodes=len(task_indices) * group_size)
        started = time.perf_counter()
        pending = list(reversed(episodes))
        ready: list[_Episode] = []
        stepping: dict[cf.Future, _Episode] = {}
        progress = _progress(len(episodes), self.config.show_progress)
        pool = self._executor()

        def finish(episode: _Episode) -> None:
            self._release(episode)
            progress.update(1)
            if on_trajectory is not None:
                on_trajectory(self._to_trajectory(episode))
            if episode.reserve:  # ARPO: the slots it did not branch into start afresh from the prompt
                refill = _Episode(episode.task_index, episode.reserve[0], episode.group_index,
                                  reserve=episode.reserve[1:])
                episodes.append(refill)
                pending.append(refill)
                stats.refills += 1

        try:
            while pending or ready or stepping:
                while pending and len(ready) + len(stepping) < self.config.max_concurrent_episodes:
                    episode = pending.pop()
                    self._start(episode, seed)
                    ready.append(episode)
                if stepping:
                    if self.config.overlap and ready:  # let fast tools join this batch, not slow ones
                        timeout, when = self._batch_wait(), cf.ALL_COMPLETED
                    elif self.config.overlap:
                        timeout, when = None, cf.FIRST_COMPLETED
                    else:  # strict rounds: every tool of the round first
                        timeout, when = None, cf.ALL_COMPLETED
                    wait_from = time.perf_counter()
                    done, _ = cf.wait(list(stepping), timeout=timeout, return_when=when)
                    stats.wait_s += time.perf_counter() - wait_from
                    for future in done:
                        episode = stepping.pop(future)
                        self._after_step(episode, *future.result())
                        if episode.end_reason:
                            finish(episode)
                        else:
                            ready.append(episode)
                if ready and (self.config.overlap or not stepping):
                    batch, ready = ready, []
                    for episode, generation in zip(batch, self._generate(batch, seed), strict=True):
                        branches = self._branch(episode, generation, seed)
                        episodes.extend(branches)
                        ready.extend(branches)
                        if self._after_generation(episode, generation):
                            finish(episode)
                        else:
                            stepping[pool.submit(self._step_env, episode, generation.text)] = episode
        finally:
            progress.close()
            for future in stepping:
                future.cancel()
            stats.wall_s = time.perf_counter() - started
        episodes.sort(key=lambda episode: (episode.group_index, episode.rollout_index))
        return [self._to_trajectory(episode) for episode in episodes]

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

    # ---- episode lifecycle -----------------------------------------------------------------------------

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

    def _release(self, episode: _Episode) -> None:
        if episode.env is not None:
            self._free_envs.append(episode.env)
            episode.env = None

    def _start(self, episode: _Episode, seed: int, parent: _Episode | None = None) -> None:
        """Reset a pooled env for ``episode``; a branch then continues its ``parent``'s episode and token record."""
        episode.env = env = self._acquire_env()
        prompt, info = env.reset(
            seed=derive_seed(seed, episode.task_index, episode.rollout_index),
            options={"task_index": episode.task_index, "rollout_index": episode.rollout_index},
        )
        episode.prompt, episode.reset_info = prompt, info
        task = getattr(env.unwrapped, "task", None)
        episode.question = getattr(task, "question", prompt)
        episode.stop = self.config.stop if self.config.stop is not None else tuple(
            closing_tags(info.get("tools", ())))
        if parent is not None:
            copy_episode(parent.env, env)
            episode.record = parent.record.fork()
            episode.turn, episode.reward, episode.num_tool_calls = parent.turn, parent.reward, parent.num_tool_calls
            episode.finish_reasons = list(parent.finish_reasons)
            episode.initial_entropy = parent.initial_entropy
            episode.branch_parent, episode.branch_prefix_tokens = parent.rollout_index, len(parent.record.token_ids)
            return
        episode.record = EpisodeRecord.start(
            self.tokenizer, info.get("system_prompt", ""), prompt,
            self.config.max_prompt_tokens, self.config.max_response_tokens,
        )

    def _branch(self, episode: _Episode, generation: Generation, seed: int) -> list[_Episode]:
        """ARPO: measure the turn just generated; after a tool result, branch the rollout as its entropy says.

        The branches continue from the tool result (before this turn), each sampling the turn afresh.
        """
        if generation.finish_reason == "error" or self.config.arpo.initial_rollouts is None:
            return []
        arpo = self.config.arpo
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
            branch = _Episode(episode.task_index, rollout_index, episode.group_index, reserve=reserve)
            self._start(branch, seed, parent=episode)
            branches.append(branch)
        self.stats.branches += len(branches)
        return branches

    def _batch_wait(self) -> float:
        if self.config.batch_wait_s is not None:
            return self.config.batch_wait_s
        calls = self.stats.generate_calls
        return 0.5 * self.stats.generate_s / calls if calls else 0.0

    def _generate(self, batch: list[_Episode], seed: int) -> list[Generation]:
        config = self.config
        contexts, params = [], []
        for episode in batch:
            remaining = episode.record.remaining
            contexts.append(episode.record.token_ids)
            params.append(SamplingParams(
                temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                max_new_tokens=min(remaining, config.max_turn_tokens or remaining),
                stop=episode.stop, top_logprobs=config.top_logprobs,
                seed=derive_seed(seed, episode.task_index, episode.rollout_index, episode.turn),
            ))
        started = time.perf_counter()
        generations = self.policy.generate(contexts, params)
        self.stats.generate_s += time.perf_counter() - started
        self.stats.generate_calls += 1
        self.stats.generated_tokens += sum(g.num_tokens for g in generations)
        return generations

    def _after_generation(self, episode: _Episode, generation: Generation) -> bool:
        """Record a policy turn; True when the episode ends without an env step (a policy failure)."""
        episode.turn += 1
        episode.finish_reasons.append(generation.finish_reason)
        if generation.finish_reason == "error":
            episode.end_reason, episode.error = "policy_error", generation.error
            return True
        episode.record.add_generation(generation, self.vocab_size)
        return False

    @staticmethod
    def _step_env(episode: _Episode, action: str) -> tuple[Any, ...]:
        started = time.perf_counter()
        try:
            result = episode.env.step(action)
        except Exception as error:  # a broken env or wrapper ends this episode, never the run
            failure = {"episode_end": "env_error", "env_error": f"{type(error).__name__}: {error}"}
            result = ("", 0.0, False, True, failure)
        return (*result, time.perf_counter() - started)

    def _after_step(self, episode: _Episode, observation: str, reward: float, terminated: bool, truncated: bool,
                    info: dict[str, Any], seconds: float) -> None:
        self.stats.env_step_s += seconds
        record = episode.record
        step = record.steps[-1]
        retrieval = info.get("retrieval")
        retrieval = dict(retrieval) if retrieval else None
        step.observation = split_spliced_text(observation, info)
        step.tool, step.tool_ok, step.retrieval = info.get("tool"), info.get("tool_ok"), retrieval
        if info.get("tool") is not None and info.get("tool_error") != "tool_limit":
            self.stats.tool_calls += 1
        episode.num_tool_calls = int(info.get("tool_calls", episode.num_tool_calls))
        episode.reward += float(reward)
        if terminated or truncated:
            episode.end_reason = info.get("episode_end", "answer" if terminated else "truncated")
            if "env_error" in info:
                episode.error = info["env_error"]
            episode.metrics = dict(info.get("metrics", {}))
            return
        if not record.add_observation(observation, retrieval) or record.remaining <= 0:
            episode.end_reason = "length"
            self._score_cut_episode(episode)

    @staticmethod
    def _score_cut_episode(episode: _Episode) -> None:
        """Score an episode the token budget cut, with the env's own reward function when it has one."""
        base = episode.env.unwrapped
        reward_fn, task = getattr(base, "reward_fn", None), getattr(base, "task", None)
        if reward_fn is None or task is None:
            return
        score = reward_fn(getattr(base, "transcript", ""), task)
        episode.reward += float(score.reward)
        episode.metrics = dict(score.metrics)

    def _to_trajectory(self, episode: _Episode) -> Trajectory:
        record = episode.record
        info = episode.reset_info
        return Trajectory(
            task_id=str(info.get("task_id", episode.task_index)),
            rollout_index=episode.rollout_index,
            question=episode.question,
            system_prompt=info.get("system_prompt", ""),
            prompt=episode.prompt,
            steps=list(record.steps) if record else [],
            reward=episode.reward,
            metrics=episode.metrics,
            num_tool_calls=episode.num_tool_calls,
            end_reason=episode.end_reason or "unfinished",
            source=self.source,
            token_ids=list(record.token_ids) if record else None,
            loss_mask=list(record.loss_mask) if record else None,
            logprobs=list(record.logprobs) if record else None,
            prompt_length=record.prompt_length if record else None,
            extra={
                "task_index": episode.task_index,
                "group_index": episode.group_index,
                "retrieval_tokens": record.retrieval_tokens if record else 0,
                "retrieval_token_spans": list(record.retrieval_token_spans) if record else [],
                "prompt_truncated": record.prompt_truncated if record else False,
                "finish_reasons": list(episode.finish_reasons),
                **({"error": episode.error} if episode.error else {}),
                **({"branch_parent": episode.branch_parent, "branch_prefix_tokens": episode.branch_prefix_tokens}
                   if episode.branch_parent is not None else {}),
            },
        )


_BRANCH = 0xB4A2C
"""Mixed into the seed of ARPO's branching draws, apart from the sampling seeds of the same turn."""


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rollouts", unit="ep", disable=not enabled)
