"""The episode lifecycle of one `RolloutEngine.run`: start, generate, step the env, branch, end.

`Scheduler` moves episodes between three queues: ``waiting`` (not started), ``ready`` (their turn to generate)
and ``stepping`` (their env step runs in the thread pool), and back to ``ready`` until they end. It gets what it
works with (the env pool, the policy, the settings, the stats to fill in), never the engine; the episodes' own
state changes only inside `Episode`.

How ready episodes are decoded: with a policy that has a running batch (`FastPolicy.continuous_batch`) and
``overlap`` and ``continuous_batching`` on, a ready episode joins the batch at its next token and leaves it when
its turn ends, while the env steps of others run; otherwise each set of ready episodes is one `Policy.generate`
call, decoded to its longest row.

With a running batch, an episode rejoins it a fixed number of decode steps after its turn ended
(``rejoin_delay_steps``), not when its tool happens to return: the batch waits for a tool that is late. So the rows
that decode together, and every token and log-prob of a run, depend only on the run's seed and inputs, never on the
tools' timing. Episodes whose results come back together are taken in group and rollout order.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rapo_agents.policies.base import Generation, Policy, SamplingParams
from rapo_agents.rollout.branching import ARPOConfig, branch_count
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.entropy import turn_entropy
from rapo_agents.rollout.env_pool import EnvPool, derive_seed
from rapo_agents.rollout.episode import Episode
from rapo_env.protocol import closing_tags
from rapo_env.trajectory import Trajectory

if TYPE_CHECKING:
    from rapo_agents.policies.continuous import ContinuousBatch

_BRANCH = 0xB4A2C
"""Mixed into the seed of ARPO's branching draws, apart from the sampling seeds of the same turn."""


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
    """Time the main thread waited for env steps: with nothing to generate, or (continuous batching) for a tool
    still running when its episode was due to rejoin the batch."""
    generate_calls: int = 0
    """``policy.generate`` calls, or decode steps of a continuous batch."""
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


@dataclasses.dataclass
class RunSettings:
    """What a `Scheduler` plays with, besides its episodes."""

    envs: EnvPool
    """Where episodes get (and give back) their envs."""
    policy: Policy
    """What generates every turn."""
    config: RolloutConfig
    """Sampling, budgets and scheduling."""
    arpo: ARPOConfig
    """ARPO's branching (off by default)."""
    pool: cf.ThreadPoolExecutor
    """The threads that run env steps."""
    vocab_size: int
    """The policy's vocabulary size (entropies are normalised by it)."""
    source: str
    """The policy's name, recorded in each trajectory."""


class Scheduler:
    """Plays ``episodes`` (and the branches and refills they lead to) to their end.

    Args:
        settings: the envs, policy, configs and threads.
        episodes: the episodes that start from the prompt, in order.
        stats: filled in as the run goes.
        seed: the run's seed (resets, sampling and branching draws derive from it per episode and turn).
        on_trajectory: called with each trajectory as soon as its episode ends.
    """

    def __init__(self, settings: RunSettings, episodes: list[Episode], stats: RolloutStats, seed: int,
                 on_trajectory: Callable[[Trajectory], None] | None = None):
        self.settings, self.config, self.stats = settings, settings.config, stats
        self.seed, self.on_trajectory = seed, on_trajectory
        self.episodes = list(episodes)
        self.waiting = list(reversed(episodes))
        self.ready: list[Episode] = []
        self.stepping: dict[cf.Future, Episode] = {}
        self.batch: ContinuousBatch | None = None
        """The running decode batch, while `run` plays with one."""
        self.clock = 0
        """Decode steps of the running batch so far (the time that rejoining counts in)."""
        self.rejoin_at: dict[cf.Future, int] = {}
        """The decode step at which each running env step's episode rejoins the batch (``rejoin_delay_steps``)."""
        self.progress = _progress(stats.episodes, self.config.show_progress)

    def run(self) -> list[Trajectory]:
        """Play every episode; their trajectories group by group, by rollout index."""
        policy, config = self.settings.policy, self.config
        continuous = config.overlap and config.continuous_batching and hasattr(policy, "continuous_batch")
        try:
            with policy.continuous_batch() if continuous else contextlib.nullcontext() as batch:
                self.batch = batch
                while self.waiting or self.ready or self.stepping or batch:
                    self.start_waiting()
                    self.collect_env_steps()
                    if batch is not None:
                        self.decode_step(batch)
                    elif self.ready and (config.overlap or not self.stepping):
                        self.generate()
        finally:
            self.progress.close()
            for future in self.stepping:
                future.cancel()
        ordered = sorted(self.episodes, key=lambda episode: (episode.group_index, episode.rollout_index))
        return [episode.to_trajectory(self.settings.source) for episode in ordered]

    def start_waiting(self) -> None:
        """Start waiting episodes while fewer than ``max_concurrent_episodes`` are in flight."""
        config = self.config
        while self.waiting and len(self.ready) + len(self.stepping) < config.max_concurrent_episodes:
            episode = self.waiting.pop()
            episode.start(self.settings.envs.acquire(), self.seed, self.settings.policy.tokenizer,
                          config.max_prompt_tokens, config.max_response_tokens, config.min_tokens_after_splice)
            self.ready.append(episode)

    def collect_env_steps(self) -> None:
        """Take the results of env steps: with a running batch, those whose episodes rejoin at this decode step
        (`_rejoining`); else with ``overlap``, the fast ones while others are ready to generate (or the first one
        when none is); without it, every step of the round."""
        if not self.stepping:
            return
        wait_from = time.perf_counter()
        if self.batch is not None and self.config.rejoin_delay_steps is not None:
            done = self._rejoining()
        else:
            done = self._finished_env_steps()
        self.stats.wait_s += time.perf_counter() - wait_from
        for future in sorted(done, key=self._rejoin_order):
            episode = self.stepping.pop(future)
            self.rejoin_at.pop(future, None)
            self._after_step(episode, *future.result())
            if episode.done:
                self._finish(episode)
            else:
                self.ready.append(episode)

    def _rejoining(self) -> list[cf.Future]:
        """The env steps whose episodes rejoin the batch at this decode step, once they are done (waited for).

        With nothing to decode meanwhile, the clock moves on to the next step at which an episode rejoins.
        """
        if not self.batch and not self.ready:
            self.clock = max(self.clock, min(self.rejoin_at.values()))
        due = [future for future in self.stepping if self.rejoin_at[future] <= self.clock]
        cf.wait(due, return_when=cf.ALL_COMPLETED)
        return due

    def _finished_env_steps(self) -> set[cf.Future]:
        """The env steps done by now, as the scheduling mode says how long to wait for them."""
        if self.batch is not None:  # decoding goes on while tools run: wait only when there is nothing to decode
            timeout, when = (0 if self.batch or self.ready else None), cf.FIRST_COMPLETED
        elif self.config.overlap and self.ready:  # let fast tools join this batch, not slow ones
            timeout, when = self._batch_wait(), cf.ALL_COMPLETED
        elif self.config.overlap:
            timeout, when = None, cf.FIRST_COMPLETED
        else:  # strict rounds: every tool of the round first
            timeout, when = None, cf.ALL_COMPLETED
        return cf.wait(list(self.stepping), timeout=timeout, return_when=when).done

    def _rejoin_order(self, future: cf.Future) -> tuple[int, int, int]:
        episode = self.stepping[future]
        return self.rejoin_at.get(future, 0), episode.group_index, episode.rollout_index

    def generate(self) -> None:
        """One batched generation over the ready episodes; each then steps its env (or ends, or branches)."""
        batch, self.ready = self.ready, []
        started = time.perf_counter()
        generations = self.settings.policy.generate([episode.record.token_ids for episode in batch],
                                                    [self._sampling(episode) for episode in batch])
        self.stats.generate_s += time.perf_counter() - started
        self.stats.generate_calls += 1
        for episode, generation in zip(batch, generations, strict=True):
            self._after_generation(episode, generation)

    def decode_step(self, batch: ContinuousBatch) -> None:
        """Let ready episodes join the running batch while it has rows, and decode one token of every row; the
        episodes whose turn ended step their env (or end, or branch)."""
        while self.ready and batch.free > 0:
            episode = self.ready.pop(0)
            batch.add(episode, episode.record.token_ids, self._sampling(episode))
        if not batch:
            return
        started = time.perf_counter()
        finished = batch.step()
        self.stats.generate_s += time.perf_counter() - started
        self.stats.generate_calls += 1
        self.clock += 1
        for episode, generation in finished:
            self._after_generation(episode, generation)

    def _sampling(self, episode: Episode) -> SamplingParams:
        """The sampling settings of the episode's next turn (its seed derives from the run, question, rollout
        and turn)."""
        config, remaining = self.config, episode.record.remaining
        stop = config.stop if config.stop is not None else closing_tags(episode.reset_info.get("tools", ()))
        return SamplingParams(
            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
            max_new_tokens=min(remaining, config.max_turn_tokens or remaining), stop=tuple(stop),
            top_logprobs=config.top_logprobs,
            seed=derive_seed(self.seed, episode.task_index, episode.rollout_index, episode.turn),
        )

    def _after_generation(self, episode: Episode, generation: Generation) -> None:
        """Record a generated turn: branch (ARPO), then step the env, or end the episode."""
        self.stats.generated_tokens += generation.num_tokens
        branches = self._branch(episode, generation)
        self.episodes.extend(branches)
        self.ready.extend(branches)
        if episode.add_generation(generation, self.settings.vocab_size):
            future = self.settings.pool.submit(_step_env, episode, generation.text)
            self.stepping[future] = episode
            if self.batch is not None and self.config.rejoin_delay_steps is not None:
                self.rejoin_at[future] = self.clock + self.config.rejoin_delay_steps
        else:
            self._finish(episode)

    def _branch(self, episode: Episode, generation: Generation) -> list[Episode]:
        """ARPO: measure the turn just generated; after a tool result, branch the rollout as its entropy says.

        The branches continue from the tool result (before this turn), each sampling the turn afresh.
        """
        arpo = self.settings.arpo
        if generation.finish_reason == "error" or arpo.initial_rollouts is None:
            return []
        entropy = turn_entropy(generation.top_logprobs, generation.entropies if generation.entropy_kind == "full"
                               else None, self.settings.vocab_size, arpo.entropy_tokens)
        delta_h = episode.branch_delta(entropy)
        if delta_h is None:
            return []
        draws = random.Random(derive_seed(self.seed, episode.task_index, episode.rollout_index, episode.turn,
                                          _BRANCH))
        count = branch_count(delta_h, [draws.random() for _ in range(arpo.beam_size - 1)], arpo.entropy_weight,
                             arpo.branch_probability)
        branches = [episode.branch(rollout_index, reserve, self.settings.envs.acquire(), self.seed)
                    for rollout_index, reserve in (episode.take_reserve(count) if count else [])]
        self.stats.branches += len(branches)
        return branches

    def _batch_wait(self) -> float:
        if self.config.batch_wait_s is not None:
            return self.config.batch_wait_s
        calls = self.stats.generate_calls
        return 0.5 * self.stats.generate_s / calls if calls else 0.0

    def _after_step(self, episode: Episode, observation: str, reward: float, terminated: bool, truncated: bool,
                    info: dict[str, Any], seconds: float) -> None:
        self.stats.env_step_s += seconds
        if info.get("tool") is not None and info.get("tool_error") != "tool_limit":
            self.stats.tool_calls += 1
        skipped = episode.record.skipped_splices
        episode.add_step(observation, reward, terminated, truncated, info)
        self.stats.skipped_splices += episode.record.skipped_splices - skipped

    def _finish(self, episode: Episode) -> None:
        self.settings.envs.release(episode.release())
        self.progress.update(1)
        if self.on_trajectory is not None:
            self.on_trajectory(episode.to_trajectory(self.settings.source))
        refill = episode.refill()  # ARPO: the slots it did not branch into start afresh from the prompt
        if refill is not None:
            self.episodes.append(refill)
            self.waiting.append(refill)
            self.stats.refills += 1


def _step_env(episode: Episode, action: str) -> tuple[Any, ...]:
    """``episode.env.step(action)`` and its seconds; a broken env or wrapper ends this episode, never the run."""
    started = time.perf_counter()
    try:
        result = episode.env.step(action)
    except Exception as error:
        failure = {"episode_end": "env_error", "env_error": f"{type(error).__name__}: {error}"}
        result = ("", 0.0, False, True, failure)
    return (*result, time.perf_counter() - started)


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rollouts", unit="ep", disable=not enabled)
