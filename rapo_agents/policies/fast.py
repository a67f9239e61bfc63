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

Example:
    >>> policy = FastPolicy.from_pretrained()                     # doctest: +SKIP
    >>> ids = policy.tokenizer.encode("The capital of France is")  # doctest: +SKIP
    >>> policy.generate([ids], SamplingParams(temperature=0, max_new_tokens=5))[0].text  # doctest: +SKIP
    ' Paris.'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rapo_agents.policies.base import Generation, SamplingParams
from rapo_agents.policies.decoding import Row, max_stop_chars, step_rows
from rapo_agents.policies.hf import HFPolicy
from rapo_agents.policies.llama_decoder import LlamaDecoder, check_supported, default_weight_format, input_maxima

CALIBRATION_TEXT = (
    "Solve the task. Think step by step, call tools when they help, and give the final answer.\n"
    "<python>\nimport math\nvalues = [i ** 2 for i in range(1, 21)]\nprint(sum(values), math.sqrt(2))\n</python>\n"
    "<result>\n2870 1.4142135623730951\n</result>\n"
    "<search>capital of France population</search>\nParis is the capital and largest city of France.\n"
    "<answer>\\boxed{2870}</answer>"
)
"""Text whose activations calibrate the int8 SmoothQuant scales at every repack (tool calls, code, prose)."""

CACHE_CHUNK = 256
"""KV cache slots added at a time: enough for most turns, so a batch rarely grows its cache."""


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
    """

    exact_logprobs = False
    """Its log-probs come from rounded weights: a trainer recomputes them with the trained module."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 32, weight_format: str | None = None,
                 recalibrate_every: int = 8, threads: int | None = 1):
        if recalibrate_every < 1:
            raise ValueError(f"recalibrate_every must be >= 1, got {recalibrate_every}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {threads}")
        super().__init__(model, tokenizer, max_batch_size=max_batch_size)
        self.recalibrate_every, self.threads = recalibrate_every, threads
        self._repacks = 0
        self._maxima: dict[str, torch.Tensor] | None = None
        self.decoder = LlamaDecoder(model.config, weight_format or default_weight_format(self.device), self.device)
        self.name = f"fast-{self.decoder.weight_format}:{self.name.removeprefix('hf:')}"
        self._calibration = torch.tensor([tokenizer.encode(CALIBRATION_TEXT)], device=self.device)
        self.repack()

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device: str | torch.device | None = "auto",
                        dtype: torch.dtype | str | None = None, max_batch_size: int = 32,
                        weight_format: str | None = None, **model_kwargs: Any) -> FastPolicy:
        """Load a Llama-family HF folder (None = the embedded SmolLM2) as `HFPolicy.from_pretrained` does."""
        reference = HFPolicy.from_pretrained(path, device=device, dtype=dtype, **model_kwargs)
        return cls(reference.model, reference.tokenizer, max_batch_size=max_batch_size, weight_format=weight_format)

    # ---- weights ---------------------------------------------------------------------------------

    def _weights_version(self) -> int:
        # Every in-place update (an optimizer step, load_state_dict) bumps a parameter's version counter.
        return sum(p._version for p in self.model.parameters())

    def repack(self) -> None:
        """Pack the module's current weights into the decoder (what a weight sync costs)."""
        if self.decoder.weight_format == "int8" and self._repacks % self.recalibrate_every == 0:
            # Smoothing is an exact rewrite whatever the scales, so scales from a few updates ago only cost
            # a little int8 precision, while the calibration forward is a third of a repack.
            with self._inference():
                self._maxima = input_maxima(self.model, self._calibration)
        self.decoder.load_from(self.model, self._maxima)
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

    def generate(self, contexts, sampling: SamplingParams | Any) -> list[Generation]:
        if self._weights_version() != self._packed_version:
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
        contexts = [contexts[i] for i in live]
        width = max(len(c) for c in contexts)
        input_ids = torch.full((len(live), width), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(live), width), dtype=torch.bool)
        for slot, context in enumerate(contexts):
            input_ids[slot, width - len(context):] = torch.tensor(context)
            valid[slot, width - len(context):] = True
        input_ids, valid = input_ids.to(device), valid.to(device)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        next_position = positions[:, -1:] + 1

        cache = self.decoder.new_cache(len(live), width + min(max(budgets), CACHE_CHUNK))
        logits = self.decoder.forward(input_ids, positions, cache, 0, valid)
        written = width
        stop_chars = max_stop_chars(params)
        while True:
            tokens, still_live = step_rows(rows, live, logits, self.tokenizer, self.eos_token_ids, stop_chars)
            if not still_live:
                break
            if len(still_live) < len(live):
                keep = torch.tensor(still_live, device=device)
                cache, next_position = cache.select(keep), next_position[keep]
                live = [live[s] for s in still_live]
                tokens = [tokens[s] for s in still_live]
            if written == cache.capacity:
                cache = cache.grow(CACHE_CHUNK)
            step_input = torch.tensor(tokens, device=device)[:, None]
            logits = self.decoder.forward(step_input, next_position, cache, written,
                                          torch.ones_like(step_input, dtype=torch.bool))
            written += 1
            next_position = next_position + 1
        return [row.to_generation(self.tokenizer) for row in rows]
