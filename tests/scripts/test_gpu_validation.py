"""scripts/gpu_validation.sh on a CPU machine: its arguments, its skip paths and the JSON it writes.

The GPU stages themselves only run where CUDA is (the first task lent a device runs them); here the
script is run for real and must say, stage by stage, that it skipped and why, inside its deadline.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "gpu_validation.sh"


def _load_helper():
    spec = importlib.util.spec_from_file_location("gpu_validation", REPO_ROOT / "scripts" / "gpu_validation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gv = _load_helper()
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU skip path: this machine has CUDA")


def run_script(*arguments: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *arguments], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


# ---- the whole script, for real ----------------------------------------------------------------------------


@cpu_only
@pytest.mark.slow
def test_without_cuda_every_gpu_stage_is_recorded_as_skipped_and_why(tmp_path):
    result = run_script("--out", str(tmp_path), "--deadline", "240")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "gpu_validation.json").read_text())
    assert list(summary["statuses"]) == list(gv.STAGE_NAMES)  # every stage, in run order
    assert summary["statuses"]["environment"] == "ok"
    environment = summary["stages"]["environment"]
    assert environment["cuda_available"] is False and environment["torch"] == torch.__version__
    for name in gv.STAGE_NAMES[1:]:
        assert summary["statuses"][name] == "skipped"
        assert summary["not_ok"][name].startswith("no CUDA device")
    assert summary["figures"] == {} and summary["targets"]["vllm_ratio_to_plain"] == 0.9
    with tarfile.open(tmp_path / "gpu_validation_logs.tar.gz") as archive:
        names = archive.getnames()
    assert "stages/install.json" in names and "logs/environment.log" in names


def test_a_deadline_too_short_for_a_stage_skips_it_and_still_writes_the_summary(tmp_path):
    result = run_script("--out", str(tmp_path), "--deadline", "16", "--only", "environment")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "gpu_validation.json").read_text())
    assert summary["statuses"] == {"environment": "skipped"}
    # The deadline counts from the script's start, so its own start-up leaves at most 1 s of the 16 (15 reserved).
    match = re.fullmatch(r"deadline: (-?\d+) s left, the stage needs at least 5 s", summary["not_ok"]["environment"])
    assert match and int(match.group(1)) <= 1


def test_only_runs_the_named_stages_in_run_order(tmp_path):
    result = run_script("--out", str(tmp_path), "--only", "retrieval,environment")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "gpu_validation.json").read_text())
    assert list(summary["statuses"]) == ["environment", "retrieval"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--deadline", "60"], "--out is required"),
        (["--out", "OUT", "--deadline", "soon"], "--deadline must be a positive whole number of seconds, got 'soon'"),
        (["--out", "OUT", "--deadline", "0"], "--deadline must be a positive whole number"),
        (["--out", "OUT", "--turbo"], "unknown argument '--turbo'"),
        (["--out", "OUT", "--model", "/no/such/model"], "is not a model folder (no config.json)"),
        (["--out", "OUT", "--wheelhouse", "/no/such/wheels"], "is not a folder"),
        (["--out", "OUT", "--only", "environment,warp_drive"], "unknown stage 'warp_drive'"),
        (["--out"], "--out needs a folder"),
    ],
)
def test_bad_arguments_get_one_clear_error_and_exit_status_2(tmp_path, arguments, message):
    arguments = [str(tmp_path / "out") if a == "OUT" else a for a in arguments]
    result = run_script(*arguments, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_help_names_every_option():
    result = run_script("--help", timeout=30)
    assert result.returncode == 0
    for option in ("--out", "--deadline", "--wheelhouse", "--skip-install", "--model", "--python", "--only"):
        assert option in result.stdout


# ---- the helper's decisions and records ----------------------------------------------------------------------


def test_skip_reasons_come_in_order_cuda_packages_model_time():
    assert gv.skip_reason("verl", cuda=False, missing=["vllm"], remaining_s=0).startswith("no CUDA device")
    assert gv.skip_reason("verl", cuda=True, missing=["vllm", "ray"], remaining_s=0).startswith(
        "missing Python package(s): vllm, ray")
    assert gv.skip_reason("train_hf", cuda=True, missing=[], remaining_s=999, model_ready=False).startswith(
        "no model folder")
    assert gv.skip_reason("train_hf", cuda=True, missing=[], remaining_s=59) == (
        "deadline: 59 s left, the stage needs at least 60 s")
    assert gv.skip_reason("train_hf", cuda=True, missing=[], remaining_s=60) is None
    assert gv.skip_reason("environment", cuda=False, missing=[], remaining_s=5) is None  # needs no GPU


def test_stage_lists_are_checked_and_put_in_run_order():
    assert gv.parse_stage_list("verl, environment") == ["environment", "verl"]
    with pytest.raises(ValueError, match="unknown stage 'gpu'"):
        gv.parse_stage_list("gpu")
    with pytest.raises(ValueError, match="empty"):
        gv.parse_stage_list(" , ")


def test_stage_budgets_fit_the_default_deadline_only_together_with_the_cut_to_time_left():
    assert all(stage.min_s <= stage.budget_s for stage in gv.STAGES)
    assert max(stage.budget_s for stage in gv.STAGES) < 540


def _record(stages_dir: Path, *arguments: str) -> dict:
    assert gv.main(["record", arguments[0], "--stages-dir", str(stages_dir), *arguments[1:]]) == 0
    return json.loads((stages_dir / f"{arguments[0]}.json").read_text())


def test_a_stage_is_recorded_ok_failed_or_timeout_from_its_exit_status(tmp_path):
    log = tmp_path / "stage.log"
    log.write_text("line\n" * 2000 + "RuntimeError: CUDA out of memory\n")
    details = tmp_path / "details.json"
    details.write_text(json.dumps({"ratio_to_plain": 0.95}))
    ok = _record(tmp_path, "vllm_generate", "--rc", "0", "--seconds", "12.34", "--details", str(details))
    assert ok["status"] == "ok" and ok["ratio_to_plain"] == 0.95 and ok["seconds"] == 12.3
    failed = _record(tmp_path, "train_vllm", "--rc", "1", "--seconds", "3", "--log", str(log))
    assert failed["status"] == "failed" and failed["reason"] == "exit status 1"
    assert failed["log_tail"].endswith("CUDA out of memory\n") and len(failed["log_tail"]) == 3000
    slow = _record(tmp_path, "verl", "--rc", "124", "--seconds", "300", "--limit-s", "300", "--log", str(log))
    assert (slow["status"], slow["reason"]) == ("timeout", "ran past its 300 s limit")
    silent = _record(tmp_path, "loss_share", "--rc", "0", "--seconds", "1", "--details", str(tmp_path / "none.json"))
    assert (silent["status"], silent["reason"]) == ("failed", "the stage wrote no none.json")


def test_a_record_needs_a_known_status(tmp_path):
    with pytest.raises(ValueError, match="status"):
        gv.write_record(tmp_path, {"stage": "verl", "status": "maybe"})


# ---- reading what the stages wrote -------------------------------------------------------------------------


def test_train_summary_reads_the_trainers_metrics_file(tmp_path):
    from rapo_agents.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"time/sync_s": 0.8, "time/step_s": 9.0, "loss/approx_kl": 0.0, "reward/mean": -0.5})
    logger.log(2, {"time/sync_s": 0.3, "time/step_s": 7.0, "loss/approx_kl": 0.004, "reward/mean": -0.25})
    logger.close()
    (tmp_path / "config.yaml").write_text(
        "model:\n  path: /models/smollm2\nrollout:\n  policy: vllm\nretrieval:\n  enabled: false\n")
    summary = gv.train_summary(tmp_path)
    assert summary["settings"] == {"policy": "vllm", "retrieval_enabled": False, "model": {"path": "/models/smollm2"}}
    assert summary["weight_sync_s"] == [0.8, 0.3]
    assert summary["second_step_approx_kl"] == 0.004 and summary["approx_kl_small"] is True
    assert [step["time/step_s"] for step in summary["steps"]] == [9.0, 7.0]
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        gv.train_summary(tmp_path / "elsewhere")


def test_retrieval_summary_takes_the_unique_workloads_speedup_at_64():
    rows = [
        {"workload": "unique", "mode": "per-request", "concurrency": 64, "qps": 100.0, "speedup": 1.0},
        {"workload": "unique", "mode": "micro-batched", "concurrency": 64, "qps": 350.0, "speedup": 3.5},
        {"workload": "unique", "mode": "micro-batched", "concurrency": 16, "qps": 200.0, "speedup": 2.0},
        {"workload": "training-like", "mode": "micro-batched", "concurrency": 64, "qps": 900.0, "speedup": 9.0},
    ]
    summary = gv.retrieval_summary({"rows": rows, "load_average": [1.0, 1.0, 1.0]})
    assert summary["speedup_c64"] == 3.5 and summary["meets_target"] is True and len(summary["rows"]) == 3
    assert gv.retrieval_summary({"rows": []})["meets_target"] is None


def test_pytest_summary_counts_a_real_junit_report(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_passes():\n    pass\n"
        "def test_fails():\n    assert 1 == 2\n"
        "@pytest.mark.skip(reason='needs CUDA')\ndef test_skipped():\n    pass\n"
    )
    junit = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(junit),
                    str(tmp_path / "test_sample.py")], cwd=tmp_path, capture_output=True, timeout=120)
    summary = gv.pytest_summary(junit)
    assert (summary["tests"], summary["passed"], summary["failures"], summary["skipped"]) == (3, 1, 1, 1)
    assert summary["failed_tests"] == ["test_sample::test_fails"] and summary["skip_reasons"] == ["needs CUDA"]


def test_summary_picks_out_the_issues_figures(tmp_path):
    gv.write_record(tmp_path, {"stage": "vllm_generate", "status": "ok", "ratio_to_plain": 0.97,
                               "rapo": {"tokens_per_s_median": 5100.0}, "plain": {"tokens_per_s_median": 5250.0}})
    gv.write_record(tmp_path, {"stage": "loss_share", "status": "ok", "loss_share": 0.004})
    gv.write_record(tmp_path, {"stage": "retrieval", "status": "failed", "reason": "exit status 1"})
    summary = gv.summary(tmp_path)
    assert summary["figures"] == {"vllm_tokens_per_s": 5100.0, "vllm_ratio_to_plain": 0.97,
                                  "loss_share_of_update": 0.004}
    assert summary["statuses"] == {"vllm_generate": "ok", "loss_share": "ok", "retrieval": "failed"}
    assert summary["not_ok"] == {"retrieval": "exit status 1"}


@pytest.mark.slow
def test_the_loss_share_measurement_runs_on_the_embedded_model(tmp_path):
    from rapo_agents.policies.hf import default_policy_path

    out = tmp_path / "loss_share.json"
    assert gv.main(["loss-share", "--model", default_policy_path(), "--device", "cpu", "--sequences", "2",
                    "--tokens", "32", "--repeats", "1", "--json", str(out)]) == 0
    measured = json.loads(out.read_text())
    assert 0 < measured["loss_share"] < 1 and measured["device"] == "cpu"
    assert len(measured["loss_s"]) == len(measured["forward_backward_s"]) == 1


@pytest.mark.slow
def test_a_model_folder_without_weights_gets_random_weights_of_its_shape(tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from rapo_agents.policies.hf import default_policy_path

    embedded = Path(default_policy_path())
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    for path in embedded.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, config_only / path.name)
    prepared = gv.prepare_model(config_only, tmp_path / "work")
    assert prepared["weights"].startswith("random init")
    network = AutoModelForCausalLM.from_pretrained(prepared["model_path"])
    assert network.num_parameters() == AutoModelForCausalLM.from_pretrained(embedded).num_parameters()
    assert gv.prepare_model(embedded, tmp_path / "work")["model_path"] == str(embedded)  # weights: used as given
