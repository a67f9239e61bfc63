"""RAPO as an skrl 2.x ``Agent``: skrl's ``SequentialTrainer`` trains a rapo policy on a rapo env.

skrl drives one environment step per timestep over a vector env of arrays. `make_skrl_env`
builds that env from any rapo env id: ``gym.make_vec`` with **SAME_STEP** autoreset (under
NEXT_STEP skrl would record the reset steps as transitions whose actions the env ignored), the
retrieval wrapper when asked, and the token-id wrappers (text <-> ``Box`` of token ids), wrapped
by ``skrl.envs.wrappers.torch.wrap_env(..., wrapper="gymnasium")``.

`RapoSkrlAgent` drives one `rapo_agents.rollout.episode.Episode` per env slot, as the rollout engine and the
verl agent loop do (the episode keeps all the bookkeeping):

- ``act``: decodes each env's observation, opens an episode with the first one (chat template) or appends it
  (`Episode.add_observation`, which ends the episode with ``length`` when it no longer fits), generates one turn
  per env with the rapo `Policy` (stop at closing tool tags) and returns the turn's token ids as the action;
- ``record_transition``: the turn's outcome (`Episode.record_outcome`: reward, tool, end); a finished episode
  becomes a `rapo_env.trajectory.Trajectory` (grouped by question for the advantages). An episode the token
  budget ended while its env goes on sends empty turns until the env ends it;
- ``post_interaction`` -> ``update``: once ``episodes_per_update`` episodes have finished, RAPO's
  advantages and loss (`rapo_agents.batch.build_batch` + `rapo_agents.update.ppo_update`, spec §5-7).

Checkpoints are off: skrl's would pickle the whole LLM every interval. Save the model with
``agent.policy.model.save_pretrained(...)`` instead.

Example:
    >>> RapoSkrlAgentCfg().experiment.checkpoint_interval
    0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from skrl.agents.torch.base import Agent, AgentCfg, ExperimentCfg
from skrl.envs.wrappers.torch import wrap_env

from rapo_agents.batch import build_batch
from rapo_agents.policies.base import TOOL_STOP_STRINGS, Policy, SamplingParams
from rapo_agents.rapo import RAPOConfig
from rapo_agents.rollout import RolloutConfig, derive_seed
from rapo_agents.rollout.episode import Episode
from rapo_agents.update import UpdateSettings, ppo_update
from rapo_env.trajectory import Trajectory
from rapo_env.wrappers.token_ids import TokenCodec, TokenIdsAction, TokenIdsObservation


def make_skrl_env(
    env_id: str,
    tokenizer: str,
    num_envs: int = 2,
    observation_tokens: int = 1024,
    action_tokens: int = 256,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    tokenizer_kwargs: dict[str, Any] | None = None,
):
    """An skrl-wrapped vector env of ``env_id`` with SAME_STEP autoreset and the token-id wrappers.

    Args:
        env_id: a registered text env (any rapo env).
        tokenizer: the policy's tokenizer (name or path): observation ids are appended to its contexts as they are.
        num_envs: parallel episodes (SyncVectorEnv).
        observation_tokens, action_tokens: sizes of the observation and action arrays.
        env_kwargs: ``gym.make`` keyword arguments.
        wrappers: text-level wrappers applied first (e.g. ``StepTraceRetrievalWrapper``).
        tokenizer_kwargs: extra ``AutoTokenizer.from_pretrained`` keyword arguments.
    """
    import rapo_env  # noqa: F401  (registers the rapo env ids)

    def token_ids(env: gym.Env) -> gym.Env:
        env = TokenIdsObservation(env, tokenizer, observation_tokens, tokenizer_kwargs=tokenizer_kwargs)
        return TokenIdsAction(env, tokenizer, action_tokens, tokenizer_kwargs=tokenizer_kwargs)

    vector_env = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        wrappers=[*wrappers, token_ids],
        **(env_kwargs or {}),
    )
    return wrap_env(vector_env, wrapper="gymnasium")


def _no_checkpoints() -> ExperimentCfg:
    return ExperimentCfg(write_interval=0, checkpoint_interval=0)


@dataclasses.dataclass(kw_only=True)
class RapoSkrlAgentCfg(AgentCfg):
    """Settings of `RapoSkrlAgent` (RAPO's own knobs are in ``rapo``)."""

    experiment: ExperimentCfg = dataclasses.field(default_factory=_no_checkpoints)
    """skrl's logging/checkpoint settings; checkpoints must stay off (they would pickle the LLM)."""
    rapo: RAPOConfig = dataclasses.field(default_factory=RAPOConfig)
    """Advantage and loss settings (spec §5-7)."""
    episodes_per_update: int = 8
    """Finished episodes collected before one RAPO update."""
    ppo_epochs: int = 1
    """Passes over each batch of episodes."""
    micro_batch_size: int = 4
    """Sequences per forward/backward."""
    learning_rate: float = 1e-6
    """AdamW learning rate (the reference's)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    rollout: RolloutConfig = dataclasses.field(default_factory=lambda: RolloutConfig(
        max_prompt_tokens=512, max_response_tokens=1024, max_turn_tokens=128))
    """How turns are generated: the prompt, response and per-turn budgets (``max_turn_tokens`` at most the env's
    action size) and the sampling (``temperature``, ``top_p``); skrl runs the episodes, so the scheduling fields are
    unused."""
    seed: int = 0
    """Seed of the sampling (each turn's seed derives from it, the env slot, the episode and the turn)."""

    def validate(self) -> bool:
        if self.experiment.checkpoint_interval != 0:
            raise ValueError("skrl checkpoints would pickle the whole LLM: keep experiment.checkpoint_interval=0")
        for name in ("episodes_per_update", "ppo_epochs", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rollout.max_turn_tokens is None:
            raise ValueError("rollout.max_turn_tokens must be set: a turn fills one fixed-size action array")
        return True


class RapoSkrlAgent(Agent):
    """An skrl agent that plays a rapo `Policy` (its model is trained in place) and learns with RAPO.

    Args:
        policy: a rapo policy whose ``model`` is a trainable ``torch.nn.Module`` (e.g. ``HFPolicy``).
        system_prompt: the env's system prompt (``info["system_prompt"]`` of a reset); skrl's ``act``
            sees no infos.
        observation_codec, action_codec: the `TokenCodec` s of the env's token-id wrappers.
        cfg: the agent's settings.
        observation_space, action_space, device: as for every skrl agent.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        system_prompt: str,
        observation_codec: TokenCodec,
        action_codec: TokenCodec,
        cfg: RapoSkrlAgentCfg | None = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        device: str | torch.device | None = None,
    ):
        cfg = cfg or RapoSkrlAgentCfg()
        cfg.validate()
        if not isinstance(getattr(policy, "model", None), torch.nn.Module):
            raise TypeError("RapoSkrlAgent trains policy.model: give a policy with a torch model (e.g. HFPolicy)")
        if cfg.rollout.max_turn_tokens > action_codec.max_tokens:
            raise ValueError(
                f"rollout.max_turn_tokens {cfg.rollout.max_turn_tokens} exceeds the action array's "
                f"{action_codec.max_tokens} tokens"
            )
        super().__init__(cfg=cfg, models={}, memory=None, observation_space=observation_space,
                         action_space=action_space, device=device)
        self.policy = policy
        self.system_prompt = system_prompt
        self.observation_codec = observation_codec
        self.action_codec = action_codec
        self.tokenizer = policy.tokenizer
        self.vocab_size = int(getattr(policy, "vocab_size", None) or len(self.tokenizer))
        self.optimizer = torch.optim.AdamW(
            policy.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.episodes: list[Episode | None] = []
        """Each env slot's running episode (None between an episode's end and the next observation)."""
        self.pending_info: list[dict[str, Any]] = []
        """Each env slot's last step info, for the observation that the next ``act`` brings."""
        self.episodes_started = 0
        self.finished: list[Trajectory] = []
        self.update_stats: list[dict[str, float]] = []

    # ---- skrl's interface ---------------------------------------------------------------------------

    def act(self, observations: torch.Tensor, states: torch.Tensor | None, *, timestep: int, timesteps: int):
        """One policy turn per env: returns ``(actions, {})`` with ``actions`` the turns' token-id arrays."""
        count = observations.shape[0]
        self._ensure_slots(count)
        for slot in range(count):
            text = self.observation_codec.decode(observations[slot].cpu().numpy())
            episode = self.episodes[slot]
            if episode is None:
                self._start_episode(slot, text)
            elif not episode.done:
                episode.add_observation(text, self.pending_info[slot])
                if episode.done:  # the budget ended it: its trajectory is complete, its env goes on
                    self.finished.append(episode.to_trajectory("skrl"))
        playing = [slot for slot in range(count) if not self.episodes[slot].done]
        generations = self.policy.generate([self.episodes[slot].record.token_ids for slot in playing],
                                           [self._sampling(slot) for slot in playing]) if playing else []
        actions = np.full((count, self.action_codec.max_tokens), self.action_codec.pad_id, dtype=np.int64)
        for slot, generation in zip(playing, generations, strict=True):
            episode = self.episodes[slot]
            if episode.add_generation(generation, self.vocab_size):
                step = episode.record.steps[-1]
                tokens = episode.record.token_ids[step.token_start : step.token_end]
                actions[slot, : len(tokens)] = tokens
            else:  # policy_error: the episode is over, its env gets empty turns until it ends
                self.finished.append(episode.to_trajectory("skrl"))
        return torch.as_tensor(actions, device=self.device), {}

    def record_transition(self, *, observations, states, actions, rewards, next_observations, next_states,
                          terminated, truncated, infos, timestep: int, timesteps: int) -> None:
        super().record_transition(
            observations=observations, states=states, actions=actions, rewards=rewards,
            next_observations=next_observations, next_states=next_states, terminated=terminated,
            truncated=truncated, infos=infos, timestep=timestep, timesteps=timesteps,
        )
        ends = zip(terminated.view(-1).tolist(), truncated.view(-1).tolist(), strict=True)
        for slot, (reward, (ended, cut)) in enumerate(zip(rewards.view(-1).tolist(), ends, strict=True)):
            episode = self.episodes[slot]
            step_info = self._slot_info(infos.get("final_info", {}) if ended or cut else infos, slot)
            if not episode.done:  # (one the budget ended waits for its env to end)
                episode.record_outcome(reward, ended, cut, step_info)
                if episode.done:
                    self.finished.append(episode.to_trajectory("skrl"))
            self.pending_info[slot] = step_info
            if ended or cut:
                self.episodes[slot] = None  # SAME_STEP: the next observation opens a new episode

    def pre_interaction(self, *, timestep: int, timesteps: int) -> None:
        """Nothing to prepare: rollouts are the agent's own episode records."""

    def post_interaction(self, *, timestep: int, timesteps: int) -> None:
        if self.training and len(self.finished) >= self.cfg.episodes_per_update:
            self.update(timestep=timestep, timesteps=timesteps)
        super().post_interaction(timestep=timestep, timesteps=timesteps)

    def update(self, *, timestep: int, timesteps: int) -> None:
        """One RAPO update (spec §5-7) on the finished episodes, grouped by question."""
        trajectories, self.finished = self.finished, []
        # Trajectories carry the question as task id, so build_batch groups the rollouts of one question.
        batch = build_batch(trajectories, self.action_codec.pad_id, config=self.cfg.rapo)
        stats = ppo_update(
            self.policy.model,
            self.optimizer,
            batch,
            self.cfg.rapo,
            UpdateSettings(
                mini_batch_rows=len(trajectories),
                micro_batch_size=self.cfg.micro_batch_size,
                ppo_epochs=self.cfg.ppo_epochs,
                grad_clip=self.cfg.grad_clip,
            ),
        )
        self.policy.model.eval()  # generation mode until the next update
        stats.update({
            "rapo/reward_mean": batch.rewards.mean().item(),
            "rapo/z_ret_mean": batch.z_ret.mean().item(),
            "rapo/f_ret_mean": batch.f_ret.mean().item(),
            "rapo/episodes": float(len(trajectories)),
        })
        self.update_stats.append(stats)
        for name, value in stats.items():
            self.track_data(name, value)

    # ---- bookkeeping ----------------------------------------------------------------------------------

    def _ensure_slots(self, count: int) -> None:
        while len(self.episodes) < count:
            self.episodes.append(None)
            self.pending_info.append({})

    def _start_episode(self, slot: int, prompt: str) -> None:
        # The question is the task id: build_batch then groups the rollouts of one question.
        episode = Episode(task_index=None, rollout_index=self.episodes_started, group_index=None)
        episode.begin(prompt, {"task_id": prompt, "system_prompt": self.system_prompt}, self.tokenizer,
                      self.cfg.rollout.max_prompt_tokens, self.cfg.rollout.max_response_tokens,
                      min_tokens_after_splice=self.cfg.rollout.min_tokens_after_splice)
        self.episodes[slot] = episode
        self.episodes_started += 1

    def _sampling(self, slot: int) -> SamplingParams:
        episode = self.episodes[slot]
        record = episode.record
        budget = max(1, min(self.cfg.rollout.max_turn_tokens, record.remaining))
        return SamplingParams(
            temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p, max_new_tokens=budget,
            stop=TOOL_STOP_STRINGS,
            seed=derive_seed(self.cfg.seed, episode.rollout_index, len(record.steps)),
        )

    @staticmethod
    def _slot_info(infos: dict[str, Any], slot: int) -> dict[str, Any]:
        """One sub-env's info out of a vector env's (arrays with ``_key`` presence masks; dicts split per key)."""
        info: dict[str, Any] = {}
        for key, values in infos.items():
            mask = infos.get(f"_{key}")
            if key.startswith("_") or (mask is not None and not mask[slot]):
                continue
            if isinstance(values, dict):
                info[key] = RapoSkrlAgent._slot_info(values, slot)
            elif isinstance(values, np.ndarray):
                info[key] = values[slot]
        return info
