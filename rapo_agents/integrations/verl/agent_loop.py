"""`RapoEnvAgentLoop`: rapo's envs, tools and retrieval wrapper inside verl's multi-turn rollout.

verl's agent-loop workers call ``run`` once per rollout; the loop plays one episode of a rapo env
(any registered id, e.g. ``RAPO-Math-v0``) against verl's rollout server, token in, token out:

1. ``env.reset(options={"task_index": row's extra_info.task_index, "rollout_index": session_id})``
   (verl's ``session_id`` is the rollout's index in its group, which drives the hybrid split);
2. the chat template is applied once to the env's system prompt and question (rapo's
   `Episode`, the rollout engine's own episode state and token bookkeeping);
3. each turn generates until a closing tool tag, runs ``env.step`` in a thread (tools are
   synchronous facades) and appends the observation's tokens once: the env's part and the
   spliced retrieval part are tokenized separately so that the retrieved tokens are counted exactly;
4. the episode ends as in the rollout engine (the env ends it, or its text no longer fits the response
   budget, scored then by the env's reward function; a retrieval splice that does not fit is skipped);
5. ``response_mask`` is 1 on generated tokens only, the episode's reward becomes ``reward_score``, and
   the step spans and retrieval marks go to ``extra_fields["rapo"]`` (see `protocol`): all read from
   `Episode.to_trajectory`, the one conversion every rapo driver uses.

Register it with verl by listing it in the agent-loop config (``configs/verl_agent_loops.yaml``):

    - name: rapo_env_agent
      _target_: rapo_agents.integrations.verl.agent_loop.RapoEnvAgentLoop
      env_id: RAPO-Math-v0
      retrieval: {retriever: default, retrieve_prob: 0.5, no_retrieve_first_k: 8, group_size: 16}

Example (import only; running it needs verl's rollout servers):
    >>> from rapo_agents.integrations.verl.agent_loop import RapoEnvAgentLoop, AGENT_NAME
    >>> AGENT_NAME
    'rapo_env_agent'
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import gymnasium as gym
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

import rapo_env  # noqa: F401  (registers the rapo env ids)
from rapo_agents.integrations.verl.protocol import EXTRA_FIELD, check_fidelity, episode_fields, retrieval_settings
from rapo_agents.buffer_build.defaults import resolve_retriever
from rapo_agents.policies.base import TOOL_STOP_STRINGS, Generation
from rapo_agents.rollout.episode import Episode
from rapo_env.trajectory import Trajectory
from rapo_env.wrappers import StepTraceRetrievalWrapper

AGENT_NAME = "rapo_env_agent"
"""The ``agent_name`` that dataset rows (and the agent-loop config) use for this loop."""


@register(AGENT_NAME)
class RapoEnvAgentLoop(AgentLoopBase):
    """One rapo episode per ``run``: env turns interleaved with generations on verl's rollout servers.

    Args:
        env_id: a registered Gymnasium id of a rapo env (text observations and actions).
        env_kwargs: keyword arguments of ``gym.make`` (dataset, sandbox, max_tool_calls, ...).
        retrieval: keyword arguments of `StepTraceRetrievalWrapper` (``retriever`` is ``"default"``,
            a buffer path or a ``/retrieve`` URL); None or empty runs pure on-policy rollouts (GRPO).
            ``select`` and ``hybrid_rule`` absent or ``auto`` follow ``fidelity`` (`protocol.retrieval_settings`).
        fidelity: ``"paper"`` or ``"reference"`` (``docs/fidelity.md``); recorded in every rollout's
            record, and the trainer refuses a record whose fidelity is not its own ``rapo.fidelity``.
        max_turns: most generations per episode (the env's own tool-call limit usually ends it first).
        *args, **kwargs: what verl passes to every agent loop.
    """

    def __init__(
        self,
        *args: Any,
        env_id: str = "RAPO-Math-v0",
        env_kwargs: dict[str, Any] | None = None,
        retrieval: dict[str, Any] | None = None,
        max_turns: int = 8,
        fidelity: str = "paper",
        **kwargs: Any,
    ):
        kwargs.pop("name", None)  # the config entry's own name, passed along by hydra.instantiate
        super().__init__(*args, **kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.fidelity = check_fidelity(fidelity)
        self.retrieval = retrieval_settings(retrieval, fidelity) if retrieval else {}
        self.max_turns = max_turns
        self.response_length = self.rollout_config.response_length

    def make_env(self, overrides: dict[str, Any] | None = None) -> gym.Env:
        """A fresh env for one episode (``overrides`` merged over ``env_kwargs``), wrapped for retrieval if set."""
        env = gym.make(self.env_id, **{**self.env_kwargs, **(overrides or {})})
        if self.retrieval:
            retrieval = dict(self.retrieval)
            if isinstance(retrieval.get("retriever"), str):
                retrieval["retriever"] = resolve_retriever(retrieval["retriever"])
            env = StepTraceRetrievalWrapper(env, **retrieval)
        return env

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info") or {}
        if "task_index" not in extra_info:
            raise ValueError("rapo_env_agent rows need extra_info.task_index (see scripts/verl/prepare_data.py)")
        options = {"task_index": int(extra_info["task_index"]), "rollout_index": int(kwargs.get("session_id", 0))}
        env = self.make_env(extra_info.get("env_kwargs"))
        try:
            return await self._play(env, options, sampling_params)
        finally:
            await asyncio.to_thread(env.close)

    async def _play(self, env: gym.Env, options: dict[str, Any], sampling_params: dict[str, Any]) -> AgentLoopOutput:
        prompt, info = await asyncio.to_thread(env.reset, options=options)
        # rapo's own episode state, as the rollout engine keeps it: chat template once, policy tokens mask 1,
        # observations and spliced retrieval text tokenized once each with mask 0, the same end rules.
        episode = Episode(options["task_index"], options["rollout_index"], group_index=0, env=env)
        task = getattr(env.unwrapped, "task", None)
        episode.begin(prompt, info, self.tokenizer, self.rollout_config.prompt_length, self.response_length,
                      question=getattr(task, "question", prompt))
        params = {**sampling_params, "stop": list(TOOL_STOP_STRINGS), "include_stop_str_in_output": True}
        metrics = {"generate_sequences": 0.0, "tool_calls": 0.0}
        loop = asyncio.get_running_loop()
        for _ in range(self.max_turns):
            started = loop.time()
            output = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=list(episode.record.token_ids),
                sampling_params={**params, "max_tokens": episode.record.remaining},
            )
            metrics["generate_sequences"] += loop.time() - started
            tokens = list(output.token_ids)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            episode.add_generation(
                Generation(token_ids=tokens, text=text, finish_reason="stop", logprobs=output.log_probs),
                self.vocab_size,
            )
            started = loop.time()
            step = await asyncio.to_thread(env.step, text)
            metrics["tool_calls"] += loop.time() - started
            episode.add_step(*step)
            if episode.done:
                break
        return self._output(episode.to_trajectory(AGENT_NAME), metrics, bool(sampling_params.get("logprobs")),
                            self.fidelity)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @staticmethod
    def _output(trajectory: Trajectory, metrics: dict[str, float], logprobs: bool,
                fidelity: str = "paper") -> AgentLoopOutput:
        """verl's output of one episode: the response part of its trajectory plus rapo's fields (see `protocol`)."""
        offset = trajectory.prompt_length
        response_ids = trajectory.token_ids[offset:]
        fields = episode_fields(
            [(step.token_start - offset, step.token_end - offset) for step in trajectory.steps],
            [int(step.retrieval is not None) for step in trajectory.steps],
            trajectory.extra["retrieval_tokens"],
            len(response_ids),
            fidelity,
        )
        return AgentLoopOutput(
            prompt_ids=trajectory.token_ids[:offset],
            response_ids=response_ids,
            response_mask=trajectory.loss_mask[offset:],
            response_logprobs=trajectory.logprobs[offset:] if logprobs else None,
            reward_score=trajectory.reward,
            num_turns=2 * len(trajectory.steps) + 1,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={EXTRA_FIELD: fields},
        )
