"""The LoRA benchmark's measurement of one system (not its timings): what it trains and what its checkpoint holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def lora_benchmark():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its siblings
    spec = importlib.util.spec_from_file_location("lora_benchmark", BENCHMARKS / "lora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))


def test_a_lora_system_trains_and_checkpoints_a_small_fraction_of_full_fine_tuning(lora_benchmark,
                                                                                  policy_tokenizer_dir):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rapo_agents.config import ModelConfig
    from rapo_agents.lora import LoraSettings

    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_dir)
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    batch = lora_benchmark.with_sampler_logprobs(base, lora_benchmark.make_batch(4, 8, 8, len(tokenizer), group=2), 2)
    full = lora_benchmark.measure(base, tokenizer, ModelConfig(trainable_layers=None), batch, 2, 1e-3)
    lora = lora_benchmark.measure(base, tokenizer, ModelConfig(trainable_layers=None, lora=LoraSettings(r=2)),
                                  batch, 2, 1e-3)
    assert lora["trainable_m"] < full["trainable_m"] / 10
    assert lora["checkpoint_mib"] < full["checkpoint_mib"] / 10  # adapter and its optimiser moments only
    assert {"update_s", "sync_s"} <= set(lora)
