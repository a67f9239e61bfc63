"""Fixtures of the policy tests: a tiny randomly initialised Llama that speaks bytes."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_policy():
    """`HFPolicy` over a 2-layer random Llama with a byte vocabulary (`ByteTokenizer`), float32 on CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapo_agents.policies import ByteTokenizer, HFPolicy

    tokenizer = ByteTokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    return HFPolicy(model, tokenizer, max_batch_size=8)
