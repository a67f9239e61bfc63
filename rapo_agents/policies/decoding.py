"""The per-step bookkeeping that every local decoding loop shares: sampling, stop checks, row state, tokens/s.

`sample_next` turns one step's logits into tokens with per-row settings and seeds, and reads the
log-probs, full-vocabulary entropies and top-k log-probs that `Generation` reports (temperature 1,
whatever the sampling temperature). `Row.finished` ends a row at an EOS token, a stop string or its
budget. `HFPolicy` and `FastPolicy` decode with these, so the same seed gives the same choice of
token from the same distribution in both.

Example:
    >>> import torch
    >>> from rapo_agents.policies.base import SamplingParams
    >>> row = Row(SamplingParams(temperature=0, max_new_tokens=4), budget=4, device=torch.device("cpu"))
    >>> tokens, logprobs, entropies, top = sample_next([row], torch.tensor([[0.0, 2.0, 1.0]]))
    >>> tokens, [round(x, 3) for x in logprobs]
    ([1], [-0.408])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from rapo_agents.policies.base import Generation, SamplingParams, find_stop


class Row:
    """One continuation being decoded: its settings, budget, seeded generator and what it produced so far."""

    __slots__ = ("params", "budget", "generator", "tokens", "logprobs", "entropies", "top", "top_ids", "finish",
                 "stop_string")

    def __init__(self, params: SamplingParams, budget: int, device: torch.device):
        self.params, self.budget = params, budget
        self.generator: torch.Generator | None = None
        if not params.greedy and params.seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(params.seed) & 0xFFFF_FFFF_FFFF)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.entropies: list[float] = []
        self.top: list[list[float]] = []
        self.top_ids: list[list[int]] = []
        self.finish: str | None = None if budget > 0 else "length"
        self.stop_string: str | None = None

    def append(self, token: int, logprob: float, entropy: float | None,
               top: tuple[list[float], list[int]] | None) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if entropy is not None:
            self.entropies.append(entropy)
        if top is not None:
            k = self.params.top_logprobs
            self.top.append(top[0][:k])
            self.top_ids.append(top[1][:k])

    def finished(self, tokenizer: Any, eos_token_ids: frozenset[int], max_stop_chars: int) -> bool:
        """Whether the last token ended the row (EOS, a stop string, or the budget); records why."""
        token = self.tokens[-1]
        if token in eos_token_ids:
            self.finish = "eos"
        elif self.params.stop:
            # Decode only the tail: a stop string spans few tokens, and decoding the whole
            # continuation every step would cost O(n^2).
            tail = tokenizer.decode(self.tokens[-(max_stop_chars + 3):], skip_special_tokens=True)
            hit = find_stop(tail, self.params.stop)
            if hit is not None:
                self.finish, self.stop_string = "stop", hit[1]
        if self.finish is None and len(self.tokens) >= self.budget:
            self.finish = "length"
        return self.finish is not None

    def to_generation(self, tokenizer: Any) -> Generation:
        params = self.params
        return Generation(
            token_ids=self.tokens,
            text=tokenizer.decode(self.tokens, skip_special_tokens=True),
            finish_reason=self.finish or "length",  # type: ignore[arg-type]
            logprobs=self.logprobs if params.logprobs else None,
            entropies=self.entropies if params.entropies else None,
            top_logprobs=self.top if params.top_logprobs else None,
            top_token_ids=self.top_ids if params.top_logprobs else None,
            stop_string=self.stop_string,
        )


def step_rows(rows: Sequence[Row], live: list[int], logits: torch.Tensor, tokenizer: Any,
              eos_token_ids: frozenset[int], stop_chars: int) -> tuple[list[int], list[int]]:
    """Sample the next token of every live row (``rows[live[slot]]`` has ``logits[slot]``) and record it.

    Returns the sampled tokens (one per slot) and the slots still live afterwards.
    """
    tokens, token_logprobs, entropies, top = sample_next([rows[i] for i in live], logits)
    still_live = []
    for slot, row_index in enumerate(live):
        row = rows[row_index]
        row.append(tokens[slot], token_logprobs[slot], entropies[slot], top[slot] if top else None)
        if not row.finished(tokenizer, eos_token_ids, stop_chars):
            still_live.append(slot)
    return tokens, still_live


def max_stop_chars(params: Sequence[SamplingParams]) -> int:
    """Length of the longest stop string of any row (how much tail `Row.finished` decodes)."""
    return max((len(s) for p in params for s in p.stop), default=0)


def sample_next(rows: Sequence[Row], logits: torch.Tensor):
    """Pick one token per row; return tokens, their log-probs, entropies and top-k log-probs (lists)."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    want_entropy = any(r.params.entropies for r in rows)
    entropies = (-(logprobs.exp() * logprobs).sum(-1)).tolist() if want_entropy else [None] * len(rows)
    k = max(r.params.top_logprobs for r in rows)
    top = None
    if k:
        values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        top = list(zip(values.tolist(), ids.tolist(), strict=True))

    tokens = logits.argmax(-1)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        probs = filtered_probs(logits[index], [rows[i].params for i in sampled])
        shared = [j for j, i in enumerate(sampled) if rows[i].generator is None]
        if shared:
            picks = torch.multinomial(probs[shared], 1).squeeze(-1)
            tokens[index[shared]] = picks
        for j, i in enumerate(sampled):
            if rows[i].generator is not None:
                tokens[i] = draw(probs[j], rows[i].generator)
    token_logprobs = logprobs.gather(-1, tokens[:, None]).squeeze(-1).tolist()
    return tokens.tolist(), token_logprobs, entropies, top


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index drawn from ``probs`` by inverse CDF with one uniform of ``generator``.

    ``torch.multinomial`` with a generator spends ~5 ms per call on a 49k vocabulary (an exponential
    draw per entry); one uniform and a search over the cumulative sum cost a few dozen microseconds.
    """
    cumulative = probs.cumsum(-1)
    u = torch.rand((), generator=generator, device=probs.device, dtype=cumulative.dtype) * cumulative[-1]
    return torch.searchsorted(cumulative, u[None]).clamp(max=probs.shape[-1] - 1)[0]


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Sampling probabilities after temperature, top-k and top-p, one setting per row."""
    temperature = torch.tensor([p.temperature for p in params], device=logits.device, dtype=logits.dtype)
    logits = logits / temperature[:, None]
    vocab = logits.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if min(top_k) < vocab or min(top_p) < 1.0:
        sorted_logits, sorted_index = logits.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        drop = rank >= torch.tensor(top_k, device=logits.device)[:, None]
        sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
        drop |= before >= torch.tensor(top_p, device=logits.device, dtype=logits.dtype)[:, None]
        drop[:, 0] = False
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_index,
                                                                 sorted_logits.masked_fill(drop, float("-inf")))
    return torch.softmax(logits, dim=-1)


class ThroughputMeter:
    """Generated tokens and seconds spent generating, summed over calls (what progress bars show as tokens/s)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self._started: float | None = None

    def __enter__(self) -> ThroughputMeter:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - (self._started or time.perf_counter())

    def count(self, generations: Sequence[Generation]) -> None:
        self.tokens += sum(g.num_tokens for g in generations)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of generation so far (0 before the first call)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0
