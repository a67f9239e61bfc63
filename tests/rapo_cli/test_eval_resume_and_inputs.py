"""`rapo eval` after the first hour (issue #29): a resume never mixes two evaluations, a failed generation is
never a wrong answer, an endpoint that is dead or does not serve --model, a wrong model path or a typo in
--env-kwargs is one line with exit code 2 before the first question, and a shared checkpoint never chooses how the
model's code runs (issue #27)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rapo_tools.serving import free_port  # a loopback port nothing listens on

ENV_KWARGS = json.dumps({"num_tasks": 3, "sandbox": "subprocess"})


def rapo(*args: str, cwd=None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "RAPO_DEBUG": "", **(env or {})})


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapo eval: error: "), lines
    return lines[0]


def scripted_eval(*extra: str, cwd=None) -> subprocess.CompletedProcess:
    return rapo("eval", "--policy", "scripted", "--limit", "1", "--env-kwargs", ENV_KWARGS, *extra, cwd=cwd)


def test_a_resume_with_other_decoding_is_refused_naming_the_difference(tmp_path):
    output = str(tmp_path / "eval.jsonl")
    assert scripted_eval("--output", output).returncode == 0
    line = one_error_line(scripted_eval("--output", output, "--greedy"))
    assert "temperature" in line and "--no-resume" in line and output in line
    again = scripted_eval("--output", output, "--limit", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "kept 1 row of" in again.stdout  # every resume says what it kept
    header = json.loads(open(output).readline())["rapo_eval_settings"]
    assert header["model"] == "scripted" and header["env"] == "RAPO-Math-v0" and header["decoding"]["temperature"]


def test_a_resume_into_a_file_without_settings_is_refused(tmp_path):
    output = tmp_path / "old.jsonl"
    output.write_text(json.dumps({"task_index": 0, "rollout_index": 0, "accuracy": 1.0}) + "\n")
    assert "older rapo" in one_error_line(scripted_eval("--output", str(output)))
    assert scripted_eval("--output", str(output), "--no-resume").returncode == 0


def test_the_default_output_names_the_settings_so_two_evaluations_never_share_a_file(tmp_path):
    assert scripted_eval(cwd=tmp_path).returncode == 0
    assert scripted_eval("--greedy", cwd=tmp_path).returncode == 0
    files = sorted(path.name for path in (tmp_path / "runs").glob("eval_RAPO-Math-v0_*.jsonl"))
    assert len(files) == 2, files


class FailingPolicy:
    """A policy whose every generation fails, as an OpenAI endpoint that went away mid-run does."""

    def __new__(cls):
        from rapo_agents.policies import ScriptedPolicy
        from rapo_agents.policies.base import Generation

        policy = ScriptedPolicy(["<answer>\\boxed{1}</answer>"])
        policy.generate = lambda contexts, sampling: [
            Generation(token_ids=[], text="", finish_reason="error", error="connection refused") for _ in contexts]
        return policy


def test_failed_generations_are_counted_apart_never_scored_and_played_again(tmp_path):
    from rapo_agents.evaluation import EvalConfig, evaluate, read_rows
    from rapo_agents.policies import ScriptedPolicy

    output = tmp_path / "eval.jsonl"
    config = EvalConfig(env_kwargs={"num_tasks": 2, "sandbox": "subprocess"}, limit=2, output=str(output),
                        show_progress=False, model="m")
    failed = evaluate(FailingPolicy(), config).summary
    assert failed["n"] == 0 and failed["failed"] == 2 and "accuracy" not in failed
    assert failed["first_error"] == "connection refused"
    assert all(row["failed"] for row in read_rows(output))
    resumed = evaluate(ScriptedPolicy(["<answer>\\boxed{1}</answer>"]), config).summary
    assert resumed["n"] == 2 and resumed["failed"] == 0  # the failed rows were not kept


def test_an_openai_policy_on_a_dead_endpoint_stops_before_the_first_question(tmp_path):
    port = free_port()
    result = rapo("eval", "--policy", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--limit", "1",
                  cwd=tmp_path)
    assert "no OpenAI-compatible server answers" in one_error_line(result)
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def local_openai_server(tiny_model_dir):
    """The base URL of `python -m rapo_agents.policies.openai_server` serving the small policy as "rapo-policy"."""
    from rapo_tools.serving import serve_command

    port = free_port()
    with serve_command([sys.executable, "-m", "rapo_agents.policies.openai_server", "--model", str(tiny_model_dir),
                        "--port", str(port)], port) as url:
        yield f"{url}/v1"


def test_an_openai_policy_asking_for_a_model_the_server_does_not_serve_names_the_served_ones(
        local_openai_server, tmp_path):
    result = rapo("eval", "--policy", "openai", "--base-url", local_openai_server, "--model", "Qwen2.5-7B",
                  "--limit", "1", cwd=tmp_path)
    line = one_error_line(result)
    assert "--model" in line and "'Qwen2.5-7B'" in line and "'rapo-policy'" in line
    assert not (tmp_path / "runs").exists()


def test_a_rollout_on_a_dead_endpoint_is_one_line_too(tmp_path):
    port = free_port()
    result = rapo("rollout", "--policy", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--episodes", "1",
                  "--output", str(tmp_path / "out.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("rapo rollout: error: --base-url: no OpenAI-compatible server answers")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_model_path_that_does_not_exist_is_one_line_without_the_hub(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    result = subprocess.run([sys.executable, "-m", "rapo_cli", "eval", "--model", "runs/nothere", "--limit", "1"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**env, "RAPO_DEBUG": ""})
    line = one_error_line(result)
    assert "--model" in line and "runs/nothere" in line


def test_a_folder_without_a_model_is_one_line(tmp_path):
    (tmp_path / "runs" / "rapo" / "checkpoints" / "step_000002").mkdir(parents=True)
    line = one_error_line(rapo("eval", "--model", "runs/rapo", "--limit", "1", cwd=tmp_path))
    assert "holds no model" in line and "step_000002" in line


def test_a_typo_in_env_kwargs_names_the_setting_it_meant():
    line = one_error_line(rapo("eval", "--env-kwargs", '{"datset": "procedural"}'))
    assert "did you mean 'dataset'" in line


@pytest.mark.parametrize("sandbox", [{"backend": "subprocess"}, {"allow_unsandboxed": True}, "subprocess"])
def test_a_checkpoint_never_sets_the_sandbox_of_rapo_eval(tmp_path, sandbox):
    from rapo_agents.config import load_config
    from rapo_cli.eval import trained_settings

    config = load_config(None, ["evaluation.heldout_tasks=2", f"data.env_kwargs={json.dumps({'sandbox': sandbox})}"])
    folder = tmp_path / "step_000001"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"step": 1, "config": config.to_dict()}))
    settings = trained_settings(str(folder), "RAPO-Math-v0")
    assert settings is not None and settings["env_kwargs"]["split"] == "test"
    assert "sandbox" not in settings["env_kwargs"] and "sandbox" in settings["ignored"]


def test_the_fast_engine_evaluates_fp32_by_default_and_a_resume_in_another_weight_format_is_refused(tmp_path):
    output = str(tmp_path / "eval.jsonl")
    embedded = ("eval", "--limit", "1", "--max-tokens", "4", "--greedy", "--env-kwargs", ENV_KWARGS, "--output", output)
    first = rapo(*embedded)
    assert first.returncode == 0, first.stderr[-2000:]
    header = json.loads(open(output).readline())["rapo_eval_settings"]
    assert header["model"] == "embedded (hf engine auto, weight format fp32)"
    line = one_error_line(rapo(*embedded, "--weight-format", "int8"))
    assert "weight format int8" in line and "--no-resume" in line


def test_a_qa_checkpoint_gives_rapo_eval_its_knowledge_base_and_passages_per_search_but_no_search_service(tmp_path):
    from rapo_agents.config import load_config
    from rapo_cli.eval import trained_settings

    config = load_config("configs/qa.yaml")
    config.data.env_kwargs.update(search={"topk": 1, "route": "/elsewhere", "timeout_s": 999},
                                  search_url="http://example.invalid")
    folder = tmp_path / "step_000001"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"step": 1, "config": config.to_dict()}))
    settings = trained_settings(str(folder), "RAPO-QA-v0")
    assert settings["env_kwargs"]["knowledge_base"] == {"questions_per_hop": 100000}
    assert settings["env_kwargs"]["search"] == {"topk": 1}
    assert "search_url" not in settings["env_kwargs"] and {"search", "search_url"} <= set(settings["ignored"])
