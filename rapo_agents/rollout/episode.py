"""The token-level record of one episode while it runs (token in, token out).

`EpisodeRecord` owns an episode's growing token context. The chat template is applied
once, to the system prompt and the first user turn; after that, policy tokens are
appended as generated (loss mask 1, their log-probs kept) and each observation is
tokenized once and appended (loss mask 0). The history is never re-tokenized.
A retrieval splice (``info["retrieval"]["span"]``, a character span of the observation)
is tokenized as its own piece, so its tokens are known exactly.

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

from rapo_agents.policies.base import Generation
from rapo_agents.rollout.entropy import step_entropies
from rapo_env.trajectory import StepRecord


class PromptTooLongError(ValueError):
    """The chat template and system prompt alone exceed the prompt token budget."""


def render_prompt(tokenizer: Any, system_prompt: str, user_prompt: str) -> list[int]:
    """Token ids of the chat-templated conversation start (system + user, then the assistant header)."""
    messages = [{"role": "user", "content": user_prompt}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
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

    @classmethod
    def start(
        cls, tokenizer: Any, system_prompt: str, user_prompt: str, max_prompt_tokens: int, max_response_tokens: int
    ) -> EpisodeRecord:
        ids, truncated = fit_prompt(tokenizer, system_prompt, user_prompt, max_prompt_tokens)
        return cls(tokenizer=tokenizer, token_ids=ids, prompt_length=len(ids), max_response_tokens=max_response_tokens,
                   prompt_truncated=truncated, loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids))

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
            generation.top_logprobs[: len(tokens)] if generation.top_logprobs else None,
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
        """Tokenize ``observation`` once and append it (loss mask 0), cut to the budget.

        A retrieval splice is tokenized as its own piece and its token span recorded in
        ``retrieval["token_span"]``. Returns False when the budget cut the observation.
        """
        pieces: list[tuple[str, bool]] = [(observation, False)]
        if retrieval is not None:
            start, end = (int(x) for x in retrieval["span"])
            if not 0 <= start <= end <= len(observation):
                raise ValueError(
                    f"retrieval span {(start, end)} lies outside the observation of {len(observation)} chars")
            pieces = [(observation[:start], False), (observation[start:end], True), (observation[end:], False)]
        budget, fits = self.remaining, True
        for text, spliced in pieces:
            if not text:
                continue
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if len(ids) > budget:
                ids, fits = ids[:budget], False
            begin = len(self.token_ids)
            self.token_ids.extend(ids)
            budget -= len(ids)
            if spliced and retrieval is not None:
                retrieval["token_span"] = (begin, len(self.token_ids))
                self.retrieval_token_spans.append((begin, len(self.token_ids)))
                self.retrieval_tokens += len(ids)
        added = len(self.token_ids) - len(self.loss_mask)
        self.loss_mask.extend([0] * added)
        self.logprobs.extend([0.0] * added)
        return fits
