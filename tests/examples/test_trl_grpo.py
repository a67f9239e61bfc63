"""examples/trl_grpo.py: TRL's GRPOTrainer runs two steps on rapo episodes, on CPU, from a fresh clone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("trl_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, policy_tokenizer_dir):
    """A 1-layer random Llama with SmolLM2's tokenizer, saved as a plain HF folder (seconds per step)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_two_grpo_steps_train_on_the_policys_tokens_of_rapo_episodes(example, tiny_model_dir, tmp_path):
    args = example.parse_args(["--model", tiny_model_dir, "--steps", "2", "--num-generations", "2",
                               "--tasks-per-step", "2", "--max-response-tokens", "96",
                               "--output-dir", str(tmp_path / "trl")])
    history = example.train(args)
    steps = [entry for entry in history if "reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    for entry in steps:
        assert -1.0 <= entry["reward"] <= 1.0  # the env's reward, not a TRL reward model's
        # TRL counted the policy's own tokens only (env_mask): fewer than the budget of whole completions.
        assert 0 < entry["completions/mean_length"] <= 96
