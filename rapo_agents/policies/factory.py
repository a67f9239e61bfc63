"""`make_policy`: build any backend by name (what the ``rapo`` commands and configs use).

Example:
    >>> make_policy("scripted", turns=["<answer>\\\\boxed{0}</answer>"]).name
    'scripted'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

POLICY_KINDS = ("hf", "vllm", "openai", "scripted")
HF_ENGINES = ("auto", "fast", "reference")
"""How ``hf`` policies decode: ``fast`` (`FastPolicy`, a packed int8/bf16 decoder), ``reference`` (`HFPolicy`,
plain transformers, exact log-probs) or ``auto`` (fast on CPU for the models it supports, else reference)."""


def policy_for_model(model: Any, tokenizer: Any, engine: str = "auto", **kwargs: Any):
    """The rollout policy of a loaded transformers ``model`` (what the trainer and ``rapo eval`` decode with).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from rapo_agents.policies import ByteTokenizer
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        >>> type(policy_for_model(model, ByteTokenizer(), engine="reference")).__name__
        'HFPolicy'
    """
    from rapo_agents.policies.fast import FastPolicy, supports
    from rapo_agents.policies.hf import HFPolicy

    if engine not in HF_ENGINES:
        raise ValueError(f"unknown hf engine {engine!r}; choose one of {HF_ENGINES}")
    on_cpu = next(model.parameters()).device.type == "cpu"
    if engine == "fast" or (engine == "auto" and on_cpu and supports(model)):
        return FastPolicy(model, tokenizer, **kwargs)
    kwargs.pop("weight_format", None)
    return HFPolicy(model, tokenizer, **kwargs)


def make_policy(
    kind: str,
    model: str | None = None,
    *,
    base_url: str | None = None,
    tokenizer: str | None = None,
    device: str = "auto",
    turns: Sequence[str] | None = None,
    engine: str = "auto",
    **kwargs: Any,
):
    """A policy of backend ``kind``.

    Args:
        kind: ``hf`` (transformers; ``model`` = HF folder or a LoRA checkpoint of a rapo run, default the embedded
            SmolLM2; decoded as ``engine`` says, one of `HF_ENGINES`), ``vllm`` (``model``
            required), ``openai`` (``base_url`` and ``tokenizer`` required; ``model`` = the served model id) or
            ``scripted`` (plays ``turns``). ``embedded`` as ``model`` or ``tokenizer`` is the embedded SmolLM2.
        kwargs: passed to the backend's constructor.
    """
    from rapo_tools.models import is_embedded

    if is_embedded(tokenizer):
        tokenizer = None  # the openai backend's default tokenizer is the embedded SmolLM2's
    if is_embedded(model) and kind in ("hf", "vllm"):
        from rapo_agents.policies.hf import default_policy_path

        model = default_policy_path()
    if kind == "hf":
        from rapo_agents.policies.hf import HFPolicy

        if engine not in HF_ENGINES:
            raise ValueError(f"unknown hf engine {engine!r}; choose one of {HF_ENGINES}")
        from rapo_agents.lora import has_adapter, load_adapted

        max_batch_size = kwargs.pop("max_batch_size", 32)
        weight_format = kwargs.pop("weight_format", None)
        if model is not None and has_adapter(model):  # a LoRA checkpoint: its base model, the adapter merged
            from rapo_agents.policies.hf import resolve_device

            loaded_model, loaded_tokenizer = load_adapted(model, resolve_device(device))
        else:
            loaded = HFPolicy.from_pretrained(model, device=device, **kwargs)
            loaded_model, loaded_tokenizer = loaded.model, loaded.tokenizer
        return policy_for_model(loaded_model, loaded_tokenizer, engine, max_batch_size=max_batch_size,
                                **({"weight_format": weight_format} if weight_format else {}))
    if kind == "vllm":
        if not model:
            raise ValueError("the vllm policy needs a model path or hub id")
        from rapo_agents.policies.vllm import VLLMPolicy

        return VLLMPolicy.from_pretrained(model, **kwargs)
    if kind == "openai":
        if not base_url:
            raise ValueError("the openai policy needs base_url (e.g. http://127.0.0.1:8000/v1)")
        from rapo_agents.policies.hf import default_policy_path
        from rapo_agents.policies.openai import OpenAIPolicy

        return OpenAIPolicy(base_url, tokenizer=tokenizer or default_policy_path(), model=model, **kwargs)
    if kind == "scripted":
        from rapo_agents.policies.scripted import ScriptedPolicy

        return ScriptedPolicy(list(turns or ["<answer>\\boxed{0}</answer>"]), **kwargs)
    raise ValueError(f"unknown policy kind {kind!r}; choose one of {POLICY_KINDS}")


def add_policy_arguments(parser: Any, default: str = "hf", extra_kinds: Sequence[str] = ()) -> None:
    """The ``--policy``, ``--model``, ``--base-url``, ``--tokenizer`` and ``--device`` options of the CLI."""
    parser.add_argument("--policy", default=default, choices=[*POLICY_KINDS, *extra_kinds],
                        help="backend: hf (transformers, CPU default), vllm (GPU), openai (any OpenAI-compatible "
                             "server), scripted (fixed turns, for smoke tests)")
    parser.add_argument("--model", default=None,
                        help="hf/vllm: model folder or hub id (hf default: embedded SmolLM2-135M-Instruct); "
                             "openai: the served model id")
    parser.add_argument("--base-url", default=None, help="openai: API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--tokenizer", default=None, help="openai: tokenizer folder of the served model")
    parser.add_argument("--device", default="auto", help="hf: cpu, cuda or auto")
    parser.add_argument("--hf-engine", default="auto", choices=HF_ENGINES,
                        help="hf: fast (packed decoder in --weight-format, several times faster on CPU), reference "
                             "(plain transformers, exact log-probs) or auto (fast on CPU)")


def policy_from_args(args: Any):
    """Build the policy that `add_policy_arguments` options describe."""
    weight_format = getattr(args, "weight_format", None)
    return make_policy(args.policy, args.model, base_url=args.base_url, tokenizer=args.tokenizer, device=args.device,
                       engine=getattr(args, "hf_engine", "auto"),
                       **({"weight_format": weight_format} if args.policy == "hf" and weight_format else {}))
