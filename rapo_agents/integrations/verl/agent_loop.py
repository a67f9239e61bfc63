"""`RapoEnvAgentLoop`: rapo's envs, tools and retrieval wrapper inside verl's multi-turn rollout.

verl's agent-loop workers call ``run`` once per rollout; the loop plays one episode of a rapo env
(any registered id, e.g. ``RAPO-Math-v0``) against verl's rollout server, token in, token out:

1. ``env.reset(options={"task_index": row's extra_info.task_index, "rollout_index": session_id})``
   (verl's ``session_id`` is the rollout's index in its group, which drives the hybrid split);
2. the chat template is applied once to the env's system prompt and question;
3. each turn generates until a closing tool tag, runs ``env.step`` in a thread (tools are
   synchronous facades) and appends the observation's tokens: the env's part and the spliced
   retrieval part are tokenized separately so that the retrieved tokens are counted exactly;
4. ``response_mask`` is 1 on generated tokens only, the env's reward becomes ``reward_score``, and
   the step spans and retrieval marks go to ``extra_fields["rapo"]`` (see `protocol`).

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
from rapo_agents.integrations.verl.protocol import EXTRA_FIELD, episode_fields
from rapo_agents.policies.base import TOOL_STOP_STRINGS
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
        **kwargs: Any,
    ):
        kwargs.pop("name", None)  # the config entry's own name, passed along by hydra.instantiate
        super().__init__(*args, **kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.retrieval = dict(retrieval or {})
        self.max_turns = max_turns
        self.response_length = self.rollout_config.response_length

    def make_env(self, overrides: dict[str, Any] | None = None) -> gym.Env:
        """A fresh env for one episode (``overrides`` merged over ``env_kwargs``), wrapped for retrieval when configured."""
        env = gym.make(self.env_id, **{**self.env_kwargs, **(overrides or {})})
        if self.retrieval:
            env = StepTraceRetrievalWrapper(env, **self.retrieval)
        return env

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

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
        messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": prompt}]
        prompt_text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = self.encode(prompt_text)
        params = {**sampling_params, "stop": list(TOOL_STOP_STRINGS), "include_stop_str_in_output": True}
        response_ids: list[int] = []
        response_mask: list[int] = []
        logprobs: list[float] = []
        spans: list[tuple[int, int]] = []
        marks: list[int] = []
        retrieval_tokens, reward, turns = 0, 0.0, 0
        metrics: dict[str, Any] = {"generate_sequences": 0.0, "tool_calls": 0.0}
        for _ in range(self.max_turns):
            budget = self.response_length - len(response_ids)
            if budget <= 0:
                break
            loop = asyncio.get_running_loop()
            started = loop.time()
            output = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids + response_ids, sampling_params={**params, "max_tokens": budget}
            )
            metrics["generate_sequences"] += loop.time() - started
            generated = list(output.token_ids)[:budget]
            spans.append((len(response_ids), len(response_ids) + len(generated)))
            marks.append(0)
            response_ids += generated
            response_mask += [1] * len(generated)
            logprobs += list(output.log_probs or [0.0] * len(generated))[: len(generated)]
            turns += 1
            started = loop.time()
            observation, step_reward, terminated, truncated, step_info = await asyncio.to_thread(
                env.step, self.tokenizer.decode(generated, skip_special_tokens=True)
            )
            metrics["tool_calls"] += loop.time() - started
            reward = float(step_reward)
            if terminated or truncated:
                break
            retrieval = step_info.get("retrieval")
            env_part, spliced = observation, ""
            if retrieval is not None:
                start, end = retrieval["span"]
                env_part, spliced = observation[:start] + observation[end:], observation[start:end]
                marks[-1] = 1
            for text, is_retrieval in ((env_part, False), (spliced, True)):
                ids = self.encode(text)[: max(0, self.response_length - len(response_ids))]
                response_ids += ids
                response_mask += [0] * len(ids)
                logprobs += [0.0] * len(ids)
                retrieval_tokens += len(ids) if is_retrieval else 0
        response_ids, response_mask, logprobs = (
            response_ids[: self.response_length],
            response_mask[: self.response_length],
            logprobs[: self.response_length],
        )
        fields = episode_fields(
            [(start, min(end, len(response_ids))) for start, end in spans], marks, retrieval_tokens, len(response_ids)
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=logprobs if sampling_params.get("logprobs") else None,
            reward_score=reward,
            num_turns=2 * turns + 1,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={EXTRA_FIELD: fields},
        )
