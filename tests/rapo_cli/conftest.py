"""Fixtures of the command-line tests: a small policy that loads in a second, and `rapo train` runs of seconds."""

import sys

import pytest


@pytest.fixture(scope="session")
def small_policy(policy_tokenizer_dir):
    """A small random Llama with the embedded SmolLM2 tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_dir)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id))
    return model, tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, small_policy):
    folder = tmp_path_factory.mktemp("tiny-model")
    for part in small_policy:  # the model and its tokenizer
        part.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_run(tiny_model_dir):
    """``tiny_run(output_dir, *overrides)``: the `rapo train` command line of a run of seconds (the small policy,
    four procedural questions, no retrieval)."""

    def command(output_dir, *overrides: str) -> list[str]:
        return tiny_train_command(tiny_model_dir, output_dir, *overrides)

    return command


def tiny_train_command(model_dir, output_dir, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rapo_cli", "train", f"model.path={model_dir}", "model.trainable_layers=null",
            f"logging.output_dir={output_dir}", "num_tasks=4", "train_batch_size=2", "ppo_mini_batch_size=2",
            "rollout_n=2", "retrieval.enabled=false",
            "logging.progress=false", "logging.tensorboard=false", "logging.plot=false",
            "data.env_kwargs={sandbox: subprocess}", "rollout.policy=hf", *overrides]
