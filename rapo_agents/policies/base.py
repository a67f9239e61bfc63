"""What every policy backend shares: `SamplingParams`, `Generation` and the `Policy` protocol.

A policy turns token contexts into continuations. Contexts are lists of token ids (the
rollout engine keeps them token-in-token-out); each continuation comes back with its
token ids, its text, and, when asked, per-token log-probs, full-vocabulary entropies
and the top-k log-probs that the reference entropy estimator needs (spec §5).

Log-probs and entropies are those of the model's own distribution (temperature 1,
no top-k/top-p), which is what a trainer recomputes in its forward pass, so the
PPO ratio compares like with like.

Example:
    >>> from rapo_agents.policies import ScriptedPolicy, SamplingParams
    >>> policy = ScriptedPolicy(["<answer>\\\\boxed{4}</answer>"])
    >>> [generation] = policy.generate([policy.tokenizer.encode("2+2?")], SamplingParams(max_new_tokens=32))
    >>> generation.text, generation.finish_reason
    ('<answer>\\\\boxed{4}</answer>', 'stop')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from rapo_env.protocol import TOOL_TAGS, closing_tags

FinishReason = Literal["stop", "eos", "length", "error"]

TOOL_STOP_STRINGS: tuple[str, ...] = tuple(closing_tags(TOOL_TAGS))
"""Closing tags at which a turn ends (``</python>``, ``</search>``, ``</answer>``): the env runs the
tool call or scores the answer."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation (the fields mirror vLLM's ``SamplingParams``)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    top_k: int = 0
    """Keep only the ``top_k`` most likely tokens; 0 (or negative) keeps all."""
    max_new_tokens: int = 512
    """Most tokens to generate for this continuation."""
    stop: tuple[str, ...] = TOOL_STOP_STRINGS
    """Stop strings; the continuation ends with the first one it produces (kept in the output)."""
    seed: int | None = None
    """Seed of this continuation's sampling; the same context and seed give the same tokens in any batch."""
    logprobs: bool = True
    """Return the log-prob of every generated token."""
    entropies: bool = True
    """Return the full-vocabulary entropy at every generated position (backends without the full
    distribution, such as vLLM and HTTP servers, return the top-k entropy instead and say so)."""
    top_logprobs: int = 10
    """Return this many top log-probs per position (the reference entropy estimator uses 10); 0 = none."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0)."""
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class Generation:
    """One continuation of one context."""

    token_ids: list[int]
    """The generated tokens (including the stop string's tokens and an EOS token when one ended it)."""
    text: str
    """The continuation's text: the decoded tokens, special tokens dropped."""
    finish_reason: FinishReason
    """``stop`` (a stop string), ``eos`` (an end-of-sequence token), ``length`` (max new tokens) or
    ``error`` (the backend failed; ``token_ids`` are empty and ``error`` says why)."""
    logprobs: list[float] | None = None
    """Log-prob of each generated token under the model (temperature 1)."""
    entropies: list[float] | None = None
    """Entropy of the model's next-token distribution at each generated position."""
    top_logprobs: list[list[float]] | None = None
    """The top-k log-probs (descending) at each generated position."""
    top_token_ids: list[list[int]] | None = None
    """The token ids of ``top_logprobs``, where the backend knows them."""
    stop_string: str | None = None
    """The stop string that ended the continuation, if any."""
    entropy_kind: Literal["full", "top_k"] = "full"
    """``full`` when ``entropies`` cover the whole vocabulary, ``top_k`` when only the top-k log-probs."""
    error: str | None = None
    """What went wrong when ``finish_reason == "error"``."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Policy(Protocol):
    """Anything that continues token contexts.

    ``sampling`` is one `SamplingParams` for the whole batch or one per context (so that
    every episode can carry its own seed and token budget).
    """

    tokenizer: Any
    """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``, ``eos_token_id``)."""

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """Continue every context; the result is in the order of ``contexts``."""
        ...


def per_context_sampling(
    contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """Expand ``sampling`` to one `SamplingParams` per context, checking the lengths."""
    if isinstance(sampling, SamplingParams):
        return [sampling] * len(contexts)
    sampling = list(sampling)
    if len(sampling) != len(contexts):
        raise ValueError(f"got {len(sampling)} SamplingParams for {len(contexts)} contexts")
    for params in sampling:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling must hold SamplingParams, not {type(params).__name__}")
    return sampling


def check_contexts(contexts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Validate token contexts (non-empty lists of non-negative ints) and return them as lists."""
    checked = []
    for index, context in enumerate(contexts):
        tokens = [int(t) for t in context]
        if not tokens:
            raise ValueError(f"context {index} is empty; a policy needs at least one token to continue")
        if min(tokens) < 0:
            raise ValueError(f"context {index} holds a negative token id")
        checked.append(tokens)
    return checked


def find_stop(text: str, stops: Sequence[str], search_from: int = 0) -> tuple[int, str] | None:
    """End position and string of the earliest stop string in ``text[search_from:]``, or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, search_from)
        if at >= 0 and (best is None or at + len(stop) < best[0]):
            best = (at + len(stop), stop)
    return best


def top_k_entropy(top_logprobs: Sequence[float]) -> float:
    """Entropy ``-sum p log p`` over the given (top-k) log-probs, without renormalising (spec §5, reference)."""
    return 0.0 - float(sum(math.exp(lp) * lp for lp in top_logprobs if math.isfinite(lp)))  # never -0.0
