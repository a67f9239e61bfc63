"""`make_policy`: build any backend by name (what the ``rapo`` commands and configs use).

Example:
    >>> make_policy("scripted", turns=["<answer>\\\\boxed{0}</answer>"]).name
    'scripted'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

POLICY_KINDS = ("hf", "vllm", "openai", "scripted")


def make_policy(
    kind: str,
    model: str | None = None,
    *,
    base_url: str | None = None,
    tokenizer: str | None = None,
    device: str = "auto",
    turns: Sequence[str] | None = None,
    **kwargs: Any,
):
    """A policy of backend ``kind``.

    Args:
        kind: ``hf`` (transformers; ``model`` = HF folder, default the embedded SmolLM2), ``vllm`` (``model``
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

        return HFPolicy.from_pretrained(model, device=device, **kwargs)
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


def policy_from_args(args: Any):
    """Build the policy that `add_policy_arguments` options describe."""
    return make_policy(args.policy, args.model, base_url=args.base_url, tokenizer=args.tokenizer, device=args.device)
