"""`FastPolicy`: the CPU default, an `HFPolicy` whose decoding runs on a packed `LlamaDecoder`.

It keeps the trained transformers module (``policy.model``, shared with a trainer or its own copy)
and decodes with an int8 (or bf16) copy of its weights and a static KV cache, several times faster
than ``transformers`` decoding on a CPU (``benchmarks/generation.py``). The copy is repacked when the
module's weights change: `sync_weights` does it, and `generate` also notices in-place updates of a
shared module (parameter version counters) so that a forgotten sync never samples from old weights.

Because the decoder rounds weights, its log-probs differ slightly from the trained module's
(``logprob_max_abs_diff`` in the benchmark); ``exact_logprobs`` is False so that the trainer
recomputes the old log-probs with the trained module (`rapo_agents.update.rollout_logprob_correction`).
Sampling settings, seeds, stop strings, top-k log-probs and entropies behave as in `HFPolicy`.

Prefix caching: a multi-turn episode asks for each turn with the previous turn's context, its generated tokens
and what the env appended, and the rows of a batch share their system prompt. The policy keeps the KV of the
sequences it decoded in a bounded LRU store (`rapo_agents.policies.prefix_cache.PrefixCache`, cleared at every
repack) and prefills only what follows a context's longest stored prefix; a prefix that rows of one batch
share is prefilled once for them all. ``prefill_stats`` counts the prompt tokens prefilled and reused. With
fp32 weights the results equal those without the store (up to float rounding). int8 rounds every activation, so
the float-level differences of another forward layout flip some roundings: its results move within int8's usual
error, as they do when the same context is decoded in another batch.

Continuous batching: `continuous_batch` opens a running batch (`rapo_agents.policies.continuous.ContinuousBatch`)
that rows join at any token and leave when they finish; the rollout scheduler decodes with it, so an episode whose
tool returns does not wait for the rest of a batch to finish its turn.

Example:
    >>> policy = FastPolicy.from_pretrained()                     # doctest: +SKIP
    >>> ids = policy.tokenizer.encode("The capital of France is")  # doctest: +SKIP
    >>> policy.generate([ids], SamplingParams(temperature=0, max_new_tokens=5))[0].text  # doctest: +SKIP
    ' Paris.'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from rapo_agents.policies.base import Generation, SamplingParams
from rapo_agents.policies.decoding import Row, max_stop_chars, step_rows
from rapo_agents.policies.hf import HFPolicy
from rapo_agents.policies.llama_decoder import (
    KVCache,
    LlamaDecoder,
    check_supported,
    default_weight_format,
)
from rapo_agents.policies.prefix_cache import Match, PrefillStats, PrefixCache, shared_prefixes

if TYPE_CHECKING:
    from rapo_agents.policies.continuous import ContinuousBatch

CALIBRATION_TEXT = (
    "Solve the task. Think step by step, call tools when they help, and give the final answer.\n"
    "<python>\nimport math\nvalues = [i ** 2 for i in range(1, 21)]\nprint(sum(values), math.sqrt(2))\n</python>\n"
    "<result>\n2870 1.4142135623730951\n</result>\n"
    "<search>capital of France population</search>\nParis is the capital and largest city of France.\n"
    "<answer>\\boxed{2870}</answer>"
)
"""Text whose activations calibrate the int8 SmoothQuant scales at every repack (tool calls, code, prose)."""

CACHE_CHUNK = 256
"""KV cache slots added at a time (to a batch's cache, or after a `ContinuousBatch`'s last column): enough for most
turns, so a cache is rarely copied into a larger one."""

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
"""The prefix store's default budget: 1 GiB holds about 23k tokens of SmolLM2-135M's float32 KV (30 layers x 3
KV heads x 64 dims x keys and values x 4 bytes = 46 KB a token), e.g. the live turns of 64 episodes of 360
tokens; the int8 and fp32 formats keep float32 KV, bf16 half of that."""

MIN_SHARED_TOKENS = 32
"""Shortest prefix of several rows that is prefilled once on its own: below it, the extra forward costs about what
it saves."""


def supports(model: Any) -> bool:
    """Whether `FastPolicy` can decode ``model`` (a Llama-family transformers model)."""
    try:
        check_supported(model.config)
    except ValueError:
        return False
    return True


class FastPolicy(HFPolicy):
    """A transformers Llama-family causal LM as a `Policy`, decoded by a packed `LlamaDecoder`.

    Args:
        model: a ``LlamaForCausalLM``; shared, not copied (the decoder packs its own copy of the weights).
        tokenizer: its tokenizer.
        max_batch_size: most contexts decoded together; longer batches are split.
        weight_format: ``int8``, ``bf16`` or ``fp32`` (None: the fastest this CPU has, see
            `rapo_agents.policies.llama_decoder.default_weight_format`).
        recalibrate_every: int8 only: rerun the SmoothQuant calibration pass every this many repacks.
        threads: torch threads while decoding (restored afterwards; None = leave them). 1 by default: in a
            training run the sandbox workers, encoders and verifiers run while the policy decodes, and on 2
            shared cores a second OpenMP thread halved batch-1 speed (``benchmarks/generation.py --threads 1 2``);
            the update, when nothing else runs, keeps the process's own setting.
        prefix_cache_bytes: budget of the `PrefixCache` of decoded sequences' KV, in bytes (0: no prefix caching,
            every context is prefilled whole); see `DEFAULT_PREFIX_CACHE_BYTES`.
    """

    exact_logprobs = False
    """Its log-probs come from rounded weights: a trainer recomputes them with the trained module."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 32, weight_format: str | None = None,
                 recalibrate_every: int = 8, threads: int | None = 1,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES):
        if recalibrate_every < 1:
            raise ValueError(f"recalibrate_every must be >= 1, got {recalibrate_every}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {threads}")
        if prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0 (0 turns prefix caching off), got {prefix_cache_bytes}")
        super().__init__(model, tokenizer, max_batch_size=max_batch_size)
        self.recalibrate_every, self.threads = recalibrate_every, threads
        self._repacks = 0
        self._maxima: dict[str, torch.Tensor] | None = None
        self.decoder = LlamaDecoder(model.config, weight_format or default_weight_format(self.device), self.device)
        self.name = f"fast-{self.decoder.weight_format}:{self.name.removeprefix('hf:')}"
        self._calibration = torch.tensor([tokenizer.encode(CALIBRATION_TEXT)], device=self.device)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        """KV of recently decoded sequences, whose prefixes later contexts skip; emptied at every repack."""
        self.prefill_stats = PrefillStats()
        """Prompt tokens prefilled and reused, summed over every `generate` call."""
        self.repack()

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device: str | torch.device | None = "auto",
                        dtype: torch.dtype | str | None = None, max_batch_size: int = 32,
                        weight_format: str | None = None, **model_kwargs: Any) -> FastPolicy:
        """Load a Llama-family HF folder (None = the embedded SmolLM2) as `HFPolicy.from_pretrained` does."""
        reference = HFPolicy.from_pretrained(path, device=device, dtype=dtype, **model_kwargs)
        return cls(reference.model, reference.tokenizer, max_batch_size=max_batch_size, weight_format=weight_format)

    def in_weight_format(self, weight_format: str) -> FastPolicy:
        """This policy, or one over the same module (so always current) that decodes in ``weight_format``.

        Held-out evaluation decodes fp32 while rollouts sample int8 (`rapo_agents.heldout.HeldoutConfig`): greedy
        answers are where int8's rounding shows, as a flipped digit that a copy of a number from the question
        needs.
        """
        if weight_format == self.decoder.weight_format:
            return self
        return FastPolicy(self.model, self.tokenizer, max_batch_size=self.max_batch_size,
                          weight_format=weight_format, recalibrate_every=self.recalibrate_every,
                          threads=self.threads, prefix_cache_bytes=self.prefix_cache.max_bytes)

    # ---- weights ---------------------------------------------------------------------------------

    def _weights_version(self) -> int:
        # Every in-place update (an optimizer step, load_state_dict) bumps a parameter's version counter.
        return sum(p._version for p in self.model.parameters())

    def repack(self) -> None:
        """Pack the module's current weights into the decoder (what a weight sync costs)."""
        if self.decoder.weight_format == "int8" and self._repacks % self.recalibrate_every == 0:
            # Smoothing is an exact rewrite whatever the scales, so scales from a few updates ago only cost
            # a little int8 precision, while calibrating (a pack without smoothing and its own forward) costs
            # more than the repack itself.
            self.decoder.load_from(self.model)
            self._maxima = self.decoder.input_maxima(self._calibration)
        self.decoder.load_from(self.model, self._maxima)
        self.prefix_cache.clear()  # KV computed with the old weights
        self._repacks += 1
        self._packed_version = self._weights_version()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy a trainer's weights into this policy's model and repack them."""
        super().load_state_dict(state_dict, strict=strict)
        self.repack()

    def sync_weights(self, source: torch.nn.Module | Mapping[str, torch.Tensor]) -> bool:
        """Bring the decoder up to date with ``source``; always True (even a shared module needs a repack)."""
        if source is self.model:
            self.repack()
            return True
        return super().sync_weights(source)

    # ---- generation --------------------------------------------------------------------------------

    def weights_changed(self) -> bool:
        """Whether the module's weights changed in place since the last repack."""
        return self._weights_version() != self._packed_version

    def continuous_batch(self) -> ContinuousBatch:
        """A running decode batch that rows join and leave at any token (`rapo_agents.policies.continuous`)."""
        from rapo_agents.policies.continuous import ContinuousBatch  # it builds on this module

        return ContinuousBatch(self)

    def generate(self, contexts, sampling: SamplingParams | Any) -> list[Generation]:
        if self.weights_changed():
            self.repack()
        before = torch.get_num_threads()
        if self.threads is not None and self.threads != before:
            torch.set_num_threads(self.threads)
        try:
            return super().generate(contexts, sampling)
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    def _generate_batch(self, contexts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        device = self.device
        budgets = [min(p.max_new_tokens, self.max_context - len(c)) for c, p in zip(contexts, params, strict=True)]
        rows = [Row(p, budget, device) for p, budget in zip(params, budgets, strict=True)]
        live = [i for i, row in enumerate(rows) if row.finish is None]
        if not live:
            return [row.to_generation(self.tokenizer) for row in rows]
        cache, logits, written = self._prefill([contexts[i] for i in live], spare=min(max(budgets), CACHE_CHUNK))
        next_position = torch.tensor([[len(contexts[i])] for i in live], device=device)
        stop_chars = max_stop_chars(params)
        while True:
            tokens, still_live = step_rows(rows, live, logits, self.tokenizer, self.eos_token_ids, stop_chars)
            self._remember(cache, live, still_live, contexts, rows)
            if not still_live:
                break
            if len(still_live) < len(live):
                cache, order = cache.keep(still_live)
                next_position = next_position[torch.tensor(order, device=device)]
                live = [live[s] for s in order]
                tokens = [tokens[s] for s in order]
            if written == cache.capacity:
                cache = cache.grow(CACHE_CHUNK)
            step_input = torch.tensor(tokens, device=device)[:, None]
            logits = self.decoder.forward(step_input, next_position, cache, written,
                                          torch.ones_like(step_input, dtype=torch.bool))
            written += 1
            next_position = next_position + 1
        return [row.to_generation(self.tokenizer) for row in rows]

    # ---- prefix caching ------------------------------------------------------------------------------

    def _prefill(self, contexts: list[list[int]], spare: int) -> tuple[KVCache, torch.Tensor, int]:
        """Prefill each context after its longest stored prefix: the cache, each row's last logits, slots used."""
        self.prefill_stats.prompt_tokens += sum(len(c) for c in contexts)
        if self.prefix_cache.max_bytes:
            self._prefill_shared(contexts)
        # At least the last token runs, for its logits.
        matches = [self.prefix_cache.lookup(c, limit=len(c) - 1) for c in contexts]
        self.prefill_stats.reused_tokens += sum(m.length for m in matches if m is not None)
        return self._forward_after(contexts, matches, spare)

    def _prefill_shared(self, contexts: list[list[int]]) -> None:
        """Prefill once, and store, each prefix that several of ``contexts`` share and the store lacks."""
        missing = [prefix for prefix in shared_prefixes(contexts, MIN_SHARED_TOKENS)
                   if (match := self.prefix_cache.lookup(prefix)) is None or match.length < len(prefix)]
        if not missing:
            return
        self._prefill_shared(missing)  # what they share among themselves first (the system prompt of a batch)
        matches = [self.prefix_cache.lookup(p, limit=len(p) - 1) for p in missing]
        cache, _, _ = self._forward_after(missing, matches, spare=0)
        for slot, prefix in enumerate(missing):
            self.prefix_cache.insert(prefix, *cache.row_kv(slot))

    def _forward_after(self, contexts: list[list[int]], matches: list[Match | None], spare: int
                       ) -> tuple[KVCache, torch.Tensor, int]:
        """One prefill forward of what follows each context's ``match``, in a new cache with ``spare`` free slots.

        A row's stored prefix ends at slot ``head`` (the longest stored prefix of the batch) and its new tokens
        end at ``head + width`` (the most new tokens of a row): the slots before each part are invalid and
        masked, and RoPE positions are given per token, so the rows need not line up.
        """
        reused = [m.length if m is not None else 0 for m in matches]
        head = max(reused)
        width = max(len(c) - k for c, k in zip(contexts, reused, strict=True))
        cache = self.decoder.new_cache(len(contexts), head + width + spare)
        input_ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(contexts), width), dtype=torch.bool)
        for slot, (context, match, length) in enumerate(zip(contexts, matches, reused, strict=True)):
            if match is not None:
                cache.place(slot, head - length, match.keys, match.values)
            input_ids[slot, width - len(context) + length:] = torch.tensor(context[length:])
            valid[slot, width - len(context) + length:] = True
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0) + torch.tensor(reused)[:, None]
        self.prefill_stats.prefilled_tokens += int(valid.sum())
        device = self.device
        logits = self.decoder.forward(input_ids.to(device), positions.to(device), cache, head, valid.to(device))
        return cache, logits, head + width

    def _remember(self, cache: KVCache, live: list[int], still_live: list[int], contexts: list[list[int]],
                  rows: list[Row]) -> None:
        """Store the KV of the rows that just finished: their context and every generated token but the last
        (which was sampled, never fed)."""
        if not self.prefix_cache.max_bytes:
            return
        going_on = set(still_live)
        for slot, index in enumerate(live):
            if slot not in going_on:
                self.prefix_cache.insert(list(contexts[index]) + rows[index].tokens[:-1], *cache.row_kv(slot))
