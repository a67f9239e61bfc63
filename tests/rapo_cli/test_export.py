"""A training checkpoint is a model you can use: `rapo eval --model <checkpoint>` runs on it, and `rapo export`
writes a folder that plain transformers loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rapo_agents.evaluation import read_rows


def rapo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, small_policy):
    """A run folder whose checkpoint holds the small policy and a trainer state without a config."""
    from rapo_agents.checkpoint import CheckpointManager

    folder = tmp_path_factory.mktemp("run")
    CheckpointManager(folder / "checkpoints").save(3, {"trainer": {"step": 3}}, *small_policy)
    return folder


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory, small_policy):
    """A checkpoint as `rapo train` writes it: the trainer state names the run's config."""
    from rapo_agents.checkpoint import CheckpointManager
    from rapo_agents.config import load_config

    config = load_config(None, ["evaluation.heldout_tasks=2", "evaluation.max_eval_tokens=8",
                                'data.env_kwargs={"sandbox": "subprocess"}'])
    folder = tmp_path_factory.mktemp("trained")
    return CheckpointManager(folder / "checkpoints").save(
        5, {"trainer": {"step": 5, "config": config.to_dict()}}, *small_policy)


def test_a_checkpoint_holds_the_tokenizer_and_chat_template(run_folder):
    checkpoint = run_folder / "checkpoints" / "step_000003"
    names = {path.name for path in checkpoint.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    template = (checkpoint / "chat_template.jinja").read_text() if "chat_template.jinja" in names else \
        json.loads((checkpoint / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|im_start|>" in template


def test_rapo_eval_runs_on_a_checkpoint(run_folder, tmp_path):
    out = tmp_path / "eval.jsonl"
    result = rapo("eval", "--policy", "hf", "--model", str(run_folder / "checkpoints" / "step_000003"),
                  "--limit", "1", "--max-tokens", "8", "--env-kwargs", '{"sandbox": "subprocess"}',
                  "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_rows(out)  # the file's first line records the settings that produced the rows
    assert len(rows) == 1 and rows[0]["response_tokens"] > 0


def test_rapo_eval_of_a_training_checkpoint_uses_its_runs_heldout_settings(trained_checkpoint, tmp_path):
    out = tmp_path / "eval.jsonl"
    result = rapo("eval", "--model", str(trained_checkpoint), "--greedy", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "held-out settings" in result.stdout
    for setting in ('"split": "test"', '"system_prompt": "short"', '"max_tool_calls": 1', "8 response tokens",
                    "(96 a turn)"):
        assert setting in result.stdout
    rows = read_rows(out)
    assert len(rows) == 2 and all(row["response_tokens"] <= 8 for row in rows)


def test_the_run_settings_of_a_checkpoint_give_way_to_the_command_line(trained_checkpoint, run_folder, tmp_path):
    from rapo_cli.eval import trained_settings

    assert trained_settings(str(trained_checkpoint), "RAPO-QA-v0") is None  # trained on another env
    assert trained_settings(str(run_folder / "checkpoints" / "step_000003"), "RAPO-Math-v0") is None  # no config
    out = tmp_path / "eval.jsonl"
    result = rapo("eval", "--model", str(trained_checkpoint), "--limit", "1", "--max-tokens", "4",
                  "--env-kwargs", '{"sandbox": "subprocess"}', "--output", str(out))
    assert result.returncode == 0 and "held-out settings" not in result.stdout, result.stderr[-2000:]
    assert len(read_rows(out)) == 1


def test_rapo_export_writes_a_folder_plain_transformers_loads(run_folder, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path / "exported"
    result = rapo("export", str(run_folder), str(target))  # a run folder stands for its newest checkpoint
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (target / "trainer_state.pt").exists()
    model = AutoModelForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert model(ids).logits.shape[-1] == len(tokenizer)
    again = rapo("export", str(run_folder), str(target))
    assert again.returncode == 2 and "not an empty folder" in again.stderr and "Traceback" not in again.stderr


def test_rapo_export_of_a_folder_without_checkpoint_says_what_to_pass(tmp_path):
    result = rapo("export", str(tmp_path), str(tmp_path / "out"))
    assert result.returncode == 2 and "holds no checkpoint" in result.stderr and "Traceback" not in result.stderr


def test_an_export_says_how_to_prompt_it_and_is_readable_by_all(trained_checkpoint, tmp_path):
    from transformers import GenerationConfig

    target = tmp_path / "exported"
    result = rapo("export", str(trained_checkpoint), str(target), "--no-check")
    assert result.returncode == 0, result.stderr[-2000:]
    card = json.loads((target / "rapo_prompt.json").read_text())
    assert card["env"] == "RAPO-Math-v0" and card["tool_tags"] == ["python"]
    assert "<python>" in card["system_prompt"] and "sandbox" not in card["env_kwargs"]
    assert card["stop_strings"] == ["</python>", "</answer>"]
    assert GenerationConfig.from_pretrained(target).stop_strings == ["</python>", "</answer>"]
    assert "rapo_prompt.json" in (target / "README.md").read_text()
    assert all(path.stat().st_mode & 0o777 == 0o644 for path in target.iterdir())
