"""LoRA (``model.lora``): the trained model carries a peft adapter, every update trains the adapter only, rollout
policies decode base + adapter merged, and checkpoints hold the adapter and resume it exactly."""

from __future__ import annotations

import pytest
import torch

from rapo_agents.checkpoint import CheckpointError, CheckpointManager, load_weights
from rapo_agents.config import ModelConfig, load_config
from rapo_agents.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_FILE,
    LoraSettings,
    add_adapter,
    has_adapter,
    is_adapted,
    merged_weights,
    unwrapped,
)
from rapo_agents.model import trainable_model
from rapo_agents.policies import ByteTokenizer
from rapo_agents.policies.base import SamplingParams


def small_llama(layers: int = 2, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=ByteTokenizer().vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def trained_adapter(model, seed: int = 1):
    """Give every adapter a non-zero B (a fresh adapter is the identity), as training would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def test_settings_refuse_what_cannot_be_trained():
    assert not LoraSettings().enabled  # full fine-tuning is the default
    for bad in ({"r": -1}, {"r": 8, "alpha": 0}, {"r": 8, "dropout": 1.0}, {"r": 8, "target_modules": []}):
        with pytest.raises(ValueError, match="model.lora"):
            LoraSettings(**bad)


def test_the_config_reads_lora_settings_from_overrides():
    config = load_config(None, ["model.lora.r=8", "model.lora.alpha=32", "model.lora.target_modules=[q_proj,v_proj]"])
    assert config.model.lora == LoraSettings(r=8, alpha=32.0, target_modules=["q_proj", "v_proj"])
    assert load_config(None, []).model.lora.enabled is False


def test_an_adapted_model_trains_only_its_adapters_and_only_on_the_trainable_layers():
    config = ModelConfig(trainable_layers=1, lora=LoraSettings(r=4, target_modules=["q_proj", "down_proj"]))
    model, _ = trainable_model(config, torch.device("cpu"), small_llama(layers=3), ByteTokenizer())
    assert is_adapted(model)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all(".lora_" in name and ".layers.2." in name for name in trainable)
    assert {name.split(".")[-4] for name in trainable} == {"q_proj", "down_proj"}


def test_target_modules_that_are_not_in_the_model_are_refused():
    with pytest.raises(ValueError, match="target_modules"):
        add_adapter(small_llama(), LoraSettings(r=4, target_modules=["nonexistent_proj"]))


def test_merged_weights_compute_what_the_adapted_model_computes_and_leave_it_untouched():
    plain = small_llama()
    base_before = {name: tensor.clone() for name, tensor in plain.state_dict().items()}
    adapted = trained_adapter(add_adapter(small_llama(), LoraSettings(r=4, alpha=8)))
    weights = merged_weights(adapted)
    assert set(weights) == set(base_before)  # the base model's names, no adapter tensors
    plain.load_state_dict(weights)
    ids = torch.tensor([[5, 17, 99, 3, 42, 7]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, adapted(ids).logits, atol=1e-5, rtol=1e-5)
        # The merge happened aside: the adapted model's base layers still hold the original weights.
        base = unwrapped(adapted).model.layers[0].self_attn.q_proj.base_layer.weight
        torch.testing.assert_close(base, base_before["model.layers.0.self_attn.q_proj.weight"])
    assert merged_weights({"w": torch.ones(1)}).keys() == {"w"}  # a state dict passes as it is


def test_the_fast_policy_decodes_base_plus_adapter_and_follows_adapter_updates():
    from rapo_agents.policies import FastPolicy

    adapted = trained_adapter(add_adapter(small_llama(), LoraSettings(r=4, alpha=8)))
    tokenizer = ByteTokenizer()
    policy = FastPolicy(adapted, tokenizer, weight_format="fp32")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, logprobs=True)
    context = tokenizer.encode("2 + 2 = ")

    def merged_policy():
        plain = small_llama()
        plain.load_state_dict(merged_weights(adapted))
        return FastPolicy(plain, tokenizer, weight_format="fp32")

    assert policy.generate([context], greedy)[0].token_ids == merged_policy().generate([context], greedy)[0].token_ids
    # An optimiser step on the adapter (in place) is noticed without an explicit sync, as for full fine-tuning.
    trained_adapter(adapted, seed=7)
    after = policy.generate([context], greedy)[0]
    expected = merged_policy().generate([context], greedy)[0]
    assert after.token_ids == expected.token_ids
    torch.testing.assert_close(torch.tensor(after.logprobs), torch.tensor(expected.logprobs), atol=1e-4, rtol=1e-4)


def test_a_lora_checkpoint_holds_the_adapter_and_loads_back_exactly(tmp_path):
    config = ModelConfig(trainable_layers=None, lora=LoraSettings(r=4))
    model, tokenizer = trainable_model(config, torch.device("cpu"), small_llama(), ByteTokenizer())
    trained_adapter(model)
    folder = CheckpointManager(tmp_path).save(1, {"trainer": {"step": 1}}, model, tokenizer)
    assert has_adapter(folder) and (folder / ADAPTER_CONFIG_FILE).is_file()
    assert not (folder / "model.safetensors").exists()
    adapter_bytes = (folder / ADAPTER_FILE).stat().st_size
    full_bytes = sum(tensor.numel() * tensor.element_size() for tensor in merged_weights(model).values())
    assert adapter_bytes < full_bytes / 4

    fresh, _ = trainable_model(config, torch.device("cpu"), small_llama(), ByteTokenizer())
    load_weights(fresh, folder)
    for (name, expected), (_, loaded) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(expected, loaded), name

    with pytest.raises(CheckpointError, match="LoRA adapter but this run trains full weights"):
        load_weights(small_llama(), folder)


def test_a_full_checkpoint_is_refused_by_a_lora_run(tmp_path):
    folder = CheckpointManager(tmp_path).save(1, {"trainer": {"step": 1}}, small_llama(), ByteTokenizer())
    adapted = add_adapter(small_llama(), LoraSettings(r=4))
    with pytest.raises(CheckpointError, match="full weights but this run trains an adapter"):
        load_weights(adapted, folder)


def test_a_lora_run_warms_up_and_trains_the_adapter_only_and_resumes_it(tmp_path):
    from rapo_agents.trainer import RAPOTrainer

    def trainer(steps: int) -> RAPOTrainer:
        config = load_config(None, [
            "num_tasks=4", "data.difficulty=1", "train_batch_size=2", "ppo_mini_batch_size=2", "rollout_n=2",
            "max_prompt_tokens=512", "max_response_tokens=512", "retrieval.enabled=false", "sft_steps=2",
            "sft_batch_size=2", "num_expert_episodes=4", "evaluation.enabled=false", "logging.progress=false",
            "logging.plot=false", "env_kwargs={sandbox: subprocess, system_prompt: Use python.}",
            "max_turn_tokens=null", f"logging.output_dir={tmp_path}", "model.lora.r=4", "trainable_layers=null",
            f"total_steps={steps}"])
        return RAPOTrainer(config, model=small_llama(), tokenizer=ByteTokenizer())

    first = trainer(1)
    base_before = {name: tensor.clone() for name, tensor in merged_weights(small_llama()).items()}
    first.train()
    adapters = {name: tensor for name, tensor in first.model.state_dict().items() if "lora_B" in name}
    assert any(tensor.abs().sum() > 0 for tensor in adapters.values())  # the warm-up trained the adapter
    for name, tensor in unwrapped(first.model).state_dict().items():
        if ".lora_" not in name:  # and nothing else
            assert torch.equal(tensor, base_before[name.replace(".base_layer.", ".")]), name
    checkpoints = first.checkpoints.checkpoints()
    assert checkpoints and all(has_adapter(folder) for folder in checkpoints)

    resumed = trainer(1)
    assert resumed.maybe_resume() == checkpoints[-1]
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_the_shipped_lora_config_turns_adapters_on_over_the_default():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "lora.yaml")
    default = load_config(None, [])
    assert config.model.lora.enabled and config.model.trainable_layers is None  # adapters wherever the warm-up trains
    assert config.optim.lr > default.optim.lr and config.warmup.sft_lr > default.warmup.sft_lr
