"""One episode while it runs (token in, token out): `Episode` (its state) and `EpisodeRecord` (its tokens).

`Episode` is the single owner of a running episode's state: who it is (task, rollout, group), its env,
its token record and its outcome (reward, end reason, tool calls). It changes only through its methods:
`Episode.start` (or `Episode.begin`), `Episode.add_generation` (a policy turn), `Episode.add_step` (what
``env.step`` returned: `Episode.record_outcome` and `Episode.add_observation`), ARPO's `Episode.branch` and
`Episode.refill`, and `Episode.release`; and
`Episode.to_trajectory` is the one way to turn it into a `rapo_env.trajectory.Trajectory` (the rollout
engine, the verl agent loop and the skrl agent all use it).

`EpisodeRecord` owns an episode's growing token context. The chat template is applied
once, to the system prompt and the first user turn; after that, policy tokens are
appended as generated (loss mask 1, their log-probs kept) and each observation is
tokenized once and appended (loss mask 0). The history is never re-tokenized.
A retrieval splice (``info["retrieval"]["span"]``, a character span of the observation)
is tokenized as its own piece, so its tokens are known exactly; a splice that does not fit the
response budget is skipped (spec §4), never cut, and counted in ``skipped_splices``, as is one that would
leave fewer than ``min_tokens_after_splice`` tokens of it (`RolloutConfig.min_tokens_after_splice`, default 0).

Example:
    >>> from rapo_agents.policies import ByteTokenizer, Generation
    >>> record = EpisodeRecord.start(ByteTokenizer(), "sys", "Q?", max_prompt_tokens=200, max_response_tokens=50)
    >>> step = record.add_generation(Generation(token_ids=[70, 71], text="CD", finish_reason="stop",
    ...                                         logprobs=[-0.1, -0.2]), vocab_size=259)
    >>> record.add_observation(" <r>", retrieval=None)
    True
    >>> record.loss_mask[record.prompt_length:]
    [1, 1, 0, 0, 0, 0]
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from rapo_agents.chat_template import render_chat_template
from rapo_agents.policies.base import Generation
from rapo_agents.rollout.branching import split_reserve
from rapo_agents.rollout.entropy import step_entropies, with_sampled_token
from rapo_agents.rollout.env_pool import derive_seed
from rapo_env.core import copy_episode
from rapo_env.wrappers.retrieval import split_spliced_text
from rapo_env.trajectory import StepRecord, Trajectory


def encode_env_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of env or tool text, in which a special-token *string* stays plain text.

    A tool that prints ``<|im_end|>`` must not end the turn in the model's eyes, so HF tokenizers
    encode with ``split_special_tokens=True`` (as `rapo_env.wrappers.token_ids.TokenCodec` does);
    a tokenizer without that option (rapo's byte tokenizer has no special-token strings) encodes as usual.

    Example:
        >>> from rapo_agents.policies import ByteTokenizer
        >>> encode_env_text(ByteTokenizer(), "ok") == ByteTokenizer().encode("ok")
        True
    """
    if callable(tokenizer):
        try:
            return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        except TypeError:  # no split_special_tokens option
            pass
    return list(tokenizer.encode(text, add_special_tokens=False))


def _forget_splice(env: Any) -> None:
    """Tell the retrieval wrapper in ``env``'s chain that its last splice was skipped (spec §4's budget)."""
    while env is not None:
        forget = getattr(type(env), "forget_splice", None)
        if forget is not None:
            forget(env)
            return
        env = getattr(env, "env", None)


def reference_rows(generation: Generation, tokens: int) -> list[list[float]] | None:
    """The first ``tokens`` rows of top log-probs the reference's step entropy sums (`with_sampled_token`)."""
    if not generation.top_logprobs:
        return None
    top = generation.top_logprobs[:tokens]
    if generation.logprobs is None:
        return [list(row) for row in top]
    return with_sampled_token(top, generation.logprobs[:tokens], generation.top_token_ids, generation.token_ids)


class PromptTooLongError(ValueError):
    """The chat template and system prompt alone exceed the prompt token budget."""


def render_prompt(tokenizer: Any, system_prompt: str, user_prompt: str) -> list[int]:
    """Token ids of the chat-templated conversation start (system + user, then the assistant header)."""
    messages = [{"role": "user", "content": user_prompt}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = render_chat_template(tokenizer, messages, tokenize=False, add_generation_prompt=True)  # time-limited
    return list(tokenizer.encode(text, add_special_tokens=False))


def fit_prompt(tokenizer: Any, system_prompt: str, user_prompt: str, max_tokens: int) -> tuple[list[int], bool]:
    """The templated prompt, cutting the user turn from the left until it fits ``max_tokens``.

    Returns the token ids and whether the user turn was cut (its end, the question proper, is kept).

    Raises:
        PromptTooLongError: when even an empty user turn does not fit.
    """
    ids = render_prompt(tokenizer, system_prompt, user_prompt)
    if len(ids) <= max_tokens:
        return ids, False
    overhead = len(render_prompt(tokenizer, system_prompt, ""))
    if overhead >= max_tokens:
        raise PromptTooLongError(
            f"the chat template and system prompt take {overhead} tokens; max_prompt_tokens is {max_tokens}"
        )
    user_ids = list(tokenizer.encode(user_prompt, add_special_tokens=False))
    keep = max_tokens - overhead
    while keep > 0:
        ids = render_prompt(tokenizer, system_prompt, tokenizer.decode(user_ids[-keep:], skip_special_tokens=True))
        if len(ids) <= max_tokens:
            return ids, True
        keep -= max(1, len(ids) - max_tokens)  # re-tokenizing at the cut can add a token or two
    return render_prompt(tokenizer, system_prompt, ""), True


@dataclasses.dataclass
class EpisodeRecord:
    """Token context, masks and steps of one running episode."""

    tokenizer: Any
    token_ids: list[int]
    prompt_length: int
    max_response_tokens: int
    prompt_truncated: bool = False
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    retrieval_tokens: int = 0
    retrieval_token_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    skipped_splices: int = 0
    """Retrieval splices left out because they did not fit the response budget (or its headroom)."""
    min_tokens_after_splice: int = 0
    """Response tokens a splice's observation must leave for the rest of the episode, or the splice is skipped
    (`RolloutConfig.min_tokens_after_splice`; 0: the paper's rule, skip only a splice that does not fit)."""

    @classmethod
    def start(
        cls, tokenizer: Any, system_prompt: str, user_prompt: str, max_prompt_tokens: int, max_response_tokens: int,
        min_tokens_after_splice: int = 0,
    ) -> EpisodeRecord:
        ids, truncated = fit_prompt(tokenizer, system_prompt, user_prompt, max_prompt_tokens)
        return cls(tokenizer=tokenizer, token_ids=ids, prompt_length=len(ids), max_response_tokens=max_response_tokens,
                   prompt_truncated=truncated, loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids),
                   min_tokens_after_splice=min_tokens_after_splice)

    def fork(self) -> EpisodeRecord:
        """An independent copy to continue a branched rollout: the prefix's tokens, masks, log-probs and steps
        (the tokenizer is shared). The branch's trajectory holds the whole prefix, so its loss, old log-probs
        and advantage are those of a full trajectory of the group."""
        return dataclasses.replace(
            self, token_ids=list(self.token_ids), loss_mask=list(self.loss_mask), logprobs=list(self.logprobs),
            steps=[copy.deepcopy(step) for step in self.steps],
            retrieval_token_spans=list(self.retrieval_token_spans))

    @property
    def response_tokens(self) -> int:
        """Tokens after the prompt: policy turns, observations and spliced text."""
        return len(self.token_ids) - self.prompt_length

    @property
    def remaining(self) -> int:
        """Response tokens still allowed."""
        return self.max_response_tokens - self.response_tokens

    def add_generation(self, generation: Generation, vocab_size: int) -> StepRecord:
        """Append a policy turn (loss mask 1) and open its step record."""
        start = len(self.token_ids)
        tokens = generation.token_ids[: max(0, self.remaining)]
        self.token_ids.extend(tokens)
        self.loss_mask.extend([1] * len(tokens))
        logprobs = generation.logprobs if generation.logprobs is not None else [0.0] * len(tokens)
        self.logprobs.extend(float(lp) for lp in logprobs[: len(tokens)])
        full_entropy = generation.entropies if generation.entropy_kind == "full" else None
        entropy_paper, entropy_reference = step_entropies(
            full_entropy[: len(tokens)] if full_entropy else None,
            reference_rows(generation, len(tokens)),
            vocab_size,
        )
        step = StepRecord(
            action=generation.text,
            observation="",
            token_start=start,
            token_end=len(self.token_ids),
            entropy_paper=entropy_paper,
            entropy_reference=entropy_reference,
        )
        self.steps.append(step)
        return step

    def add_observation(self, observation: str, retrieval: dict[str, Any] | None) -> bool:
        """Tokenize ``observation`` once and append it (loss mask 0); False when the budget cut it.

        A retrieval splice is tokenized as its own piece and its token span recorded in
        ``retrieval["token_span"]``. A splice that does not fit what is left of the budget, or after whose
        observation fewer than ``min_tokens_after_splice`` tokens would be left, is skipped whole (spec §4: the
        episode goes on without it, and ``skipped_splices`` counts it); the caller sees that ``retrieval`` got no
        ``token_span``. Only the env's own text is ever cut.
        """
        pieces: list[tuple[str, bool]] = [(observation, False)]
        if retrieval is not None:
            start, end = (int(x) for x in retrieval["span"])
            if not 0 <= start <= end <= len(observation):
                raise ValueError(
                    f"retrieval span {(start, end)} lies outside the observation of {len(observation)} chars")
            pieces = [(observation[:start], False), (observation[start:end], True), (observation[end:], False)]
        encoded = [(encode_env_text(self.tokenizer, text) if text else [], spliced)
                   for text, spliced in pieces]
        left_after = self.remaining - sum(len(ids) for ids, _ in encoded)
        if retrieval is not None and left_after < self.min_tokens_after_splice:
            encoded = [(ids, spliced) for ids, spliced in encoded if not spliced]
            self.skipped_splices += 1
        budget, fits = self.remaining, True
        for ids, spliced in encoded:
            if len(ids) > budget:
                ids, fits = ids[:budget], False
            begin = len(self.token_ids)
            self.token_ids.extend(ids)
            budget -= len(ids)
            if spliced:
                retrieval["token_span"] = (begin, len(self.token_ids))
                self.retrieval_token_spans.append((begin, len(self.token_ids)))
                self.retrieval_tokens += len(ids)
        added = len(self.token_ids) - len(self.loss_mask)
        self.loss_mask.extend([0] * added)
        self.logprobs.extend([0.0] * added)
        return fits

    def token_fields(self) -> dict[str, Any]:
        """The record's part of a `Trajectory`: token ids, loss mask, log-probs, prompt length and steps."""
        return {"steps": list(self.steps), "token_ids": list(self.token_ids), "loss_mask": list(self.loss_mask),
                "logprobs": list(self.logprobs), "prompt_length": self.prompt_length}

    def token_extra(self) -> dict[str, Any]:
        """The record's part of `Trajectory.extra`: retrieval tokens and spans, prompt cut, skipped splices."""
        return {"retrieval_tokens": self.retrieval_tokens, "retrieval_token_spans": list(self.retrieval_token_spans),
                "prompt_truncated": self.prompt_truncated, "skipped_splices": self.skipped_splices}


@dataclasses.dataclass
class Episode:
    """The state of one running episode, and the only code that changes it.

    Args:
        task_index, rollout_index, group_index: which question, which rollout of its group, which group of the
            run (None for a driver that has no task list or groups, e.g. skrl's, which groups by task id).

    A driver (the rollout engine, the verl agent loop, the skrl agent) calls `start` with an env (or `begin`
    after its own ``env.reset``), then alternates `add_generation` with `add_step` until `done`, and finally
    `to_trajectory`; `release` hands the env back. ARPO's branching adds `branch_delta`, `branch` and `refill`.

    Example:
        >>> from rapo_agents.policies import ByteTokenizer, Generation
        >>> episode = Episode(task_index=0, rollout_index=0, group_index=0)
        >>> episode.begin("What is 6*7?", {"task_id": "q0", "system_prompt": ""}, ByteTokenizer(), 200, 80)
        >>> episode.add_generation(Generation(token_ids=[60, 62], text="<>", finish_reason="stop"), vocab_size=259)
        True
        >>> episode.add_step(" <result>\\n42\\n</result>", 0.0, False, False, {"tool": "python", "tool_calls": 1})
        >>> episode.done, episode.num_tool_calls
        (False, 1)
        >>> episode.add_generation(Generation(token_ids=[65], text="A", finish_reason="stop"), vocab_size=259)
        True
        >>> episode.add_step("", 1.0, True, False, {"episode_end": "answer", "metrics": {"correct": 1.0}})
        >>> trajectory = episode.to_trajectory(source="example")
        >>> trajectory.end_reason, trajectory.reward, len(trajectory.steps)
        ('answer', 1.0, 2)
    """

    task_index: int | None
    rollout_index: int
    group_index: int | None
    env: Any = None
    """The env playing this episode (a pooled one in the engine; None once released)."""
    record: EpisodeRecord | None = None
    """Token context, masks and steps (None until `begin`)."""
    reset_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    prompt: str = ""
    question: str = ""
    turn: int = 0
    """Policy turns generated so far."""
    reward: float = 0.0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    num_tool_calls: int = 0
    end_reason: str | None = None
    """None while the episode runs; then the env's (``answer``, ``tool_limit``, ...), ``length`` or ``policy_error``."""
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    """Each turn's ``Generation.finish_reason``."""
    error: str | None = None
    reserve: list[int] = dataclasses.field(default_factory=list)
    """ARPO: the group's slots this rollout may fill with branches (or, when it ends, with fresh rollouts)."""
    initial_entropy: float | None = None
    """ARPO: H_initial, the entropy of the rollout's first turn (a branch keeps its parent's)."""
    branch_parent: int | None = None
    """ARPO: the rollout index this one branched off (None: it started from the prompt)."""
    branch_prefix_tokens: int | None = None
    """ARPO: tokens shared with the parent."""

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def begin(self, prompt: str, reset_info: dict[str, Any], tokenizer: Any, max_prompt_tokens: int,
              max_response_tokens: int, question: str | None = None, min_tokens_after_splice: int = 0) -> None:
        """Start from ``env.reset``'s prompt and info: template the prompt once into a fresh token record
        (``min_tokens_after_splice``: `EpisodeRecord.min_tokens_after_splice`)."""
        self.prompt, self.reset_info = prompt, dict(reset_info)
        self.question = prompt if question is None else question
        self.record = EpisodeRecord.start(tokenizer, reset_info.get("system_prompt", ""), prompt,
                                          max_prompt_tokens, max_response_tokens, min_tokens_after_splice)

    def start(self, env: Any, run_seed: int, tokenizer: Any, max_prompt_tokens: int,
              max_response_tokens: int, min_tokens_after_splice: int = 0) -> None:
        """Play in ``env``: reset it for this task and rollout (its seed derived from ``run_seed`` and both
        indices, so no result depends on which env serves the episode), then `begin`."""
        self.env = env
        prompt, info = self._reset(run_seed)
        self.begin(prompt, info, tokenizer, max_prompt_tokens, max_response_tokens, question=self._question(prompt),
                   min_tokens_after_splice=min_tokens_after_splice)

    def branch(self, rollout_index: int, reserve: list[int], env: Any, run_seed: int) -> Episode:
        """ARPO: rollout ``rollout_index`` of the group, continuing this one from its last tool result in ``env``
        (reset as `start` would, then given a copy of this episode's env state) with ``reserve`` as its slots."""
        child = Episode(self.task_index, rollout_index, self.group_index, env=env, reserve=reserve)
        prompt, info = child._reset(run_seed)
        child.prompt, child.reset_info, child.question = prompt, dict(info), child._question(prompt)
        copy_episode(self.env, env)
        child.continue_from(self)
        return child

    def refill(self) -> Episode | None:
        """ARPO, once this rollout ended: the first of the slots it did not branch into, to start afresh from the
        prompt with the rest as its reserve (None when none is left)."""
        if not self.reserve:
            return None
        return Episode(self.task_index, self.reserve[0], self.group_index, reserve=self.reserve[1:])

    def branch_delta(self, entropy: float | None) -> float | None:
        """ARPO, before the turn just generated is recorded: keep the first turn's entropy as H_initial; after a
        tool result, with slots left to fill, the turn's entropy change from it (0 when either is unknown).
        None when this turn cannot branch."""
        if not self.record.steps:
            self.initial_entropy = entropy
            return None
        if not self.reserve or self.record.steps[-1].tool is None:
            return None
        return 0.0 if entropy is None or self.initial_entropy is None else entropy - self.initial_entropy

    def take_reserve(self, count: int) -> list[tuple[int, list[int]]]:
        """ARPO: give ``count`` branches their share of this rollout's slots, (rollout index, reserve) each."""
        self.reserve, children = split_reserve(self.reserve, count)
        return children

    def release(self) -> Any:
        """Stop using the env (to give it back to a pool); returns it, None when already released."""
        env, self.env = self.env, None
        return env

    def _reset(self, run_seed: int) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=derive_seed(run_seed, self.task_index, self.rollout_index),
                              options={"task_index": self.task_index, "rollout_index": self.rollout_index})

    def _question(self, prompt: str) -> str:
        """The task's question, when the env has a task with one (else the prompt)."""
        return getattr(getattr(self.env.unwrapped, "task", None), "question", prompt)

    def continue_from(self, parent: Episode) -> None:
        """ARPO: take over ``parent``'s progress (a copy of its token record, turn, reward and counts)."""
        self.record = parent.record.fork()
        self.turn, self.reward, self.num_tool_calls = parent.turn, parent.reward, parent.num_tool_calls
        self.finish_reasons = list(parent.finish_reasons)
        self.initial_entropy = parent.initial_entropy
        self.branch_parent, self.branch_prefix_tokens = parent.rollout_index, len(parent.record.token_ids)

    def add_generation(self, generation: Generation, vocab_size: int) -> bool:
        """Record a policy turn; False when the policy failed (the episode then ends with ``policy_error``)."""
        self.turn += 1
        self.finish_reasons.append(generation.finish_reason)
        if generation.finish_reason == "error":
            self.end_reason, self.error = "policy_error", generation.error
            return False
        self.record.add_generation(generation, vocab_size)
        return True

    def add_step(self, observation: str, reward: float, terminated: bool, truncated: bool,
                 info: dict[str, Any]) -> None:
        """Record what ``env.step`` returned for the last turn: `record_outcome`, then, unless the env ended the
        episode, `add_observation`."""
        self.record_outcome(reward, terminated, truncated, info)
        if self.done:  # the env's last words (usually none) are kept, never tokenized
            self.record.steps[-1].observation = split_spliced_text(observation, info)
        else:
            self.add_observation(observation, info)

    def record_outcome(self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        """The last turn's outcome: its tool, the reward, the tool-call count, and the end when the env ends the
        episode (with its metrics). A driver that gets the observation apart (skrl's vector env) calls this and
        `add_observation` itself; `add_step` does both."""
        step = self.record.steps[-1]
        step.tool, step.tool_ok = info.get("tool"), info.get("tool_ok")
        self.num_tool_calls = int(info.get("tool_calls", self.num_tool_calls))
        self.reward += float(reward)
        if terminated or truncated:
            self.end_reason = str(info.get("episode_end", "answer" if terminated else "truncated"))
            if "env_error" in info:
                self.error = info["env_error"]
            self.metrics = dict(info.get("metrics", {}))

    def add_observation(self, observation: str, info: dict[str, Any]) -> None:
        """Append the env's observation to the token record (``info["retrieval"]`` marks a splice in it).

        The episode ends with ``length`` when the env's own observation does not fit the response budget (or
        fills it): it is then scored with the env's reward function. A retrieval splice that does not fit (or
        leaves less than ``min_tokens_after_splice``) is skipped instead (`EpisodeRecord.add_observation`), the
        wrapper is told, and the step keeps no retrieval mark.
        """
        record = self.record
        step = record.steps[-1]
        step.observation = split_spliced_text(observation, info)
        retrieval = dict(info["retrieval"]) if info.get("retrieval") else None
        fits = record.add_observation(observation, retrieval)
        step.retrieval = retrieval if retrieval is not None and "token_span" in retrieval else None
        if retrieval is not None and step.retrieval is None:
            _forget_splice(self.env)
        if not fits or record.remaining <= 0:
            self.end_reason = "length"
            self._score_cut_episode()

    def _score_cut_episode(self) -> None:
        """Score an episode the token budget cut, with the env's own reward function when it has one."""
        base = getattr(self.env, "unwrapped", None)
        reward_fn, task = getattr(base, "reward_fn", None), getattr(base, "task", None)
        if reward_fn is None or task is None:
            return
        score = reward_fn(getattr(base, "transcript", ""), task)
        self.reward += float(score.reward)
        self.metrics = dict(score.metrics)

    def to_trajectory(self, source: str, extra: dict[str, Any] | None = None) -> Trajectory:
        """The episode as a `Trajectory` (token-level record included); ``extra`` is merged into its ``extra``."""
        info, record = self.reset_info, self.record
        token_fields = record.token_fields() if record is not None else {"steps": []}
        return Trajectory(
            task_id=str(info.get("task_id", self.task_index)),
            rollout_index=self.rollout_index,
            question=self.question,
            system_prompt=info.get("system_prompt", ""),
            prompt=self.prompt,
            reward=self.reward,
            metrics=dict(self.metrics),
            num_tool_calls=self.num_tool_calls,
            end_reason=self.end_reason or "unfinished",
            source=source,
            **token_fields,
            extra={
                **({"task_index": self.task_index} if self.task_index is not None else {}),
                **({"group_index": self.group_index} if self.group_index is not None else {}),
                **(record.token_extra() if record is not None else {}),
                "finish_reasons": list(self.finish_reasons),
                **({"error": self.error} if self.error else {}),
                **({"branch_parent": self.branch_parent, "branch_prefix_tokens": self.branch_prefix_tokens}
                   if self.branch_parent is not None else {}),
                **(extra or {}),
            },
        )
