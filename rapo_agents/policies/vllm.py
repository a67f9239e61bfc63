"""`VLLMPolicy`: batched generation with vLLM on a GPU (the ``[gpu]`` extra).

One ``LLM.generate`` call per batch, token-id prompts, stop strings kept in the output,
``logprobs=k`` for the reference's top-k entropy estimator (vLLM returns the model's raw
log-probs, as `HFPolicy` does), prefix caching on (the G rollouts of a group share their
prompt). For training on the same GPU: `VLLMPolicy.load_state_dict` loads a trainer's
weights, `sleep` frees the GPU memory of weights and KV cache, `wake_up` brings it back.

vLLM does not expose the full next-token distribution, so ``entropies`` are top-k
entropies (``entropy_kind="top_k"``) and the paper's full-vocabulary step entropy is left
to the trainer's forward pass.

Example:
    >>> policy = VLLMPolicy.from_pretrained("Qwen/Qwen2.5-7B-Instruct")     # doctest: +SKIP
    >>> ids = policy.tokenizer.encode("1+1=")                               # doctest: +SKIP
    >>> policy.generate([ids], SamplingParams(temperature=0, max_new_tokens=4))[0].text  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rapo_agents.lora import merged_weights
from rapo_agents.policies.base import (
    Generation,
    SamplingParams,
    check_contexts,
    find_stop,
    per_context_sampling,
    top_k_entropy,
)


class VLLMPolicy:
    """A vLLM ``LLM`` as a `Policy`.

    Args:
        llm: a ``vllm.LLM`` (build one with `VLLMPolicy.from_pretrained`).
        vocab_size: the model's vocabulary size (for the reference entropy's log|V|).
    """

    def __init__(self, llm: Any, vocab_size: int | None = None, lora_request: Any = None):
        self.llm = llm
        self.lora_request = lora_request
        """The LoRA adapter every generation applies (``vllm.lora.request.LoRARequest``), or None."""
        self.tokenizer = llm.get_tokenizer()
        self.vocab_size = int(vocab_size or len(self.tokenizer))
        self.name = "vllm"
        self.asleep = False

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "bfloat16",
        enable_sleep_mode: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> VLLMPolicy:
        """Start vLLM on ``path`` with prefix caching (and sleep mode, so training can share the GPU).

        A LoRA checkpoint of a rapo run (`rapo_agents.lora.has_adapter`) starts vLLM on its run's base model with
        LoRA on, and every generation applies the adapter (written for vLLM's LoRA API; not run here: no GPU).
        """
        from transformers import AutoConfig
        from vllm import LLM

        from rapo_agents.lora import adapter_settings, base_model_path, has_adapter

        lora_request = None
        if has_adapter(path):
            from vllm.lora.request import LoRARequest

            settings, _ = adapter_settings(path)
            lora_request = LoRARequest("rapo-adapter", 1, str(path))
            llm_kwargs = {"enable_lora": True, "max_lora_rank": settings.r, **llm_kwargs}
            path = base_model_path(path)
        llm = LLM(
            model=path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True, enable_sleep_mode=enable_sleep_mode,
            max_model_len=max_model_len, seed=seed, **llm_kwargs,
        )
        return cls(llm, vocab_size=getattr(AutoConfig.from_pretrained(path), "vocab_size", None),
                   lora_request=lora_request)

    # ---- generation --------------------------------------------------------------------------------

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        from vllm import SamplingParams as VllmSampling

        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep; call wake_up() before generate()")
        contexts = check_contexts(contexts)
        params = per_context_sampling(contexts, sampling)
        vllm_params = [
            VllmSampling(
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
                max_tokens=p.max_new_tokens, stop=list(p.stop), include_stop_str_in_output=True, seed=p.seed,
                logprobs=max(p.top_logprobs, 1) if (p.logprobs or p.top_logprobs or p.entropies) else None,
            )
            for p in params
        ]
        outputs = self.llm.generate([{"prompt_token_ids": c} for c in contexts], vllm_params, use_tqdm=False,
                                    lora_request=self.lora_request)
        return [self._to_generation(output.outputs[0], p) for output, p in zip(outputs, params, strict=True)]

    def _to_generation(self, completion: Any, p: SamplingParams) -> Generation:
        token_ids = list(completion.token_ids)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        logprobs = tops = None
        if completion.logprobs:
            logprobs, tops = [], []
            for token, candidates in zip(token_ids, completion.logprobs, strict=True):
                chosen = candidates.get(token)
                logprobs.append(float(chosen.logprob) if chosen is not None else 0.0)
                ranked = sorted((c for c in candidates.values() if c.rank is not None and c.rank <= p.top_logprobs),
                                key=lambda c: c.rank)
                tops.append([float(c.logprob) for c in ranked])
        hit = find_stop(text, p.stop) if p.stop else None
        if completion.finish_reason == "length":
            reason = "length"
        else:
            reason = "stop" if hit is not None else "eos"
        return Generation(
            token_ids=token_ids, text=text, finish_reason=reason,
            logprobs=logprobs if p.logprobs else None,
            entropies=[top_k_entropy(t) for t in tops] if tops and p.entropies else None,
            top_logprobs=tops if p.top_logprobs else None,
            stop_string=hit[1] if hit is not None else None,
            entropy_kind="top_k",
        )

    # ---- weights and memory -----------------------------------------------------------------------------

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a trainer's weights (HF parameter names) into the running engine."""
        weights = list(state_dict.items()) if isinstance(state_dict, Mapping) else list(state_dict)
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
        if worker is not None:  # in-process engine: load directly, no copies between processes
            worker.model_runner.model.load_weights(weights)
        else:
            self.llm.collective_rpc(_load_weights_on_worker, args=([(n, t.cpu()) for n, t in weights],))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def sync_weights(self, source: torch.nn.Module | Mapping[str, torch.Tensor]) -> bool:
        """Load ``source``'s weights (a module or a state dict); always a copy with vLLM."""
        self.load_state_dict(merged_weights(source))
        return True

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory (level 1: offload weights to CPU and drop the KV cache; level 2: drop both)."""
        if not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = True

    def wake_up(self) -> None:
        """Bring weights and KV cache back to the GPU."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside a vLLM worker process (``collective_rpc``): load the weights into its model."""
    device = next(worker.model_runner.model.parameters()).device
    loaded = worker.model_runner.model.load_weights([(name, tensor.to(device)) for name, tensor in weights])
    return len(loaded or ())
