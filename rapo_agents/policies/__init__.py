"""Policies: token contexts in, continuations (tokens, log-probs, entropies) out.

Backends share `Policy`, `SamplingParams` and `Generation` (`rapo_agents.policies.base`);
each backend lives in its own module and is imported lazily, so that ``vllm`` or a
model load is only paid for by those who use it.

Example:
    >>> from rapo_agents.policies import ScriptedPolicy, SamplingParams
    >>> ScriptedPolicy(["<answer>\\\\boxed{2}</answer>"]).generate([[5]], SamplingParams())[0].finish_reason
    'stop'
"""

from __future__ import annotations

from typing import Any

from rapo_agents.policies.base import (
    TOOL_STOP_STRINGS,
    Generation,
    Policy,
    SamplingParams,
    top_k_entropy,
)
from rapo_agents.policies.scripted import ByteTokenizer, ScriptedPolicy

_LAZY = {
    "HFPolicy": "rapo_agents.policies.hf",
    "FastPolicy": "rapo_agents.policies.fast",
    "default_policy_path": "rapo_agents.policies.hf",
    "VLLMPolicy": "rapo_agents.policies.vllm",
    "OpenAIPolicy": "rapo_agents.policies.openai",
    "make_policy": "rapo_agents.policies.factory",
    "policy_for_model": "rapo_agents.policies.factory",
}

__all__ = [
    "TOOL_STOP_STRINGS",
    "ByteTokenizer",
    "Generation",
    "Policy",
    "SamplingParams",
    "ScriptedPolicy",
    "top_k_entropy",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
