"""A LoRA run's checkpoint is a model you can use too: `rapo eval --model <checkpoint>` plays its base model with the
adapter merged, and `rapo export` writes the merged model as a folder that plain transformers loads."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rapo_agents.evaluation import read_rows


def rapo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory, tiny_model_dir):
    """A checkpoint as a LoRA run of `rapo train` writes it (adapter, tokenizer, trainer state naming the base), with
    a trained (non-zero) adapter; and the adapted model it came from."""
    from rapo_agents.checkpoint import CheckpointManager
    from rapo_agents.config import load_config
    from rapo_agents.model import trainable_model

    config = load_config(None, [f"model.path={tiny_model_dir}", "model.lora.r=4", "model.trainable_layers=null",
                                "evaluation.heldout_tasks=2", 'data.env_kwargs={"sandbox": "subprocess"}'])
    model, tokenizer = trainable_model(config.model, torch.device("cpu"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(3))
    folder = tmp_path_factory.mktemp("lora-run")
    checkpoint = CheckpointManager(folder / "checkpoints").save(
        4, {"trainer": {"step": 4, "config": config.to_dict()}}, model, tokenizer)
    return checkpoint, model.eval()


def test_rapo_export_of_a_lora_checkpoint_merges_the_adapter_into_a_plain_model(lora_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    checkpoint, adapted = lora_checkpoint
    result = rapo("export", str(checkpoint.parent.parent), str(tmp_path / "merged"))  # the run folder
    assert result.returncode == 0, result.stderr[-2000:]
    names = {path.name for path in (tmp_path / "merged").iterdir()}
    assert {"config.json", "model.safetensors", "rapo_prompt.json"} <= names and "adapter_config.json" not in names
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([[1, 20, 300, 4000, 7]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, adapted(ids).logits, atol=1e-4, rtol=1e-4)


def test_rapo_eval_runs_on_a_lora_checkpoint(lora_checkpoint, tmp_path):
    checkpoint, _ = lora_checkpoint
    out = tmp_path / "eval.jsonl"
    result = rapo("eval", "--policy", "hf", "--model", str(checkpoint), "--limit", "1", "--max-tokens", "8",
                  "--env-kwargs", '{"sandbox": "subprocess"}', "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_rows(out)
    assert len(rows) == 1 and rows[0]["response_tokens"] > 0
