"""Every user mistake on the command line ends in one line naming the setting and the fix: exit code 2, no
traceback, and no work done first (each case answers in seconds)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

MISSING = "/nonexistent/rapo-test"

CASES = {
    "train: missing data file": (["train", f"data.source={MISSING}/train.parquet"], "data.source"),
    "train: missing data file without warm-up": (
        ["train", f"data.source={MISSING}/train.parquet", "warmup.sft_steps=0", "retrieval.enabled=false"],
        "data.source"),
    "train: TRL name under a section": (["train", "optim.learning_rate=1e-6"], "optim.lr"),
    "train: bad enum": (["train", "model.dtype=fp64"], "model.dtype"),
    "train: missing config file": (["train", "--config", f"{MISSING}.yaml"], "--config"),
    "train: missing buffer": (["train", f"retrieval.retriever={MISSING}.jsonl",
                               f"retrieval.index_path={MISSING}.index"], "retrieval.retriever"),
    "train: unknown env": (["train", "data.env_id=RAPO-Nope-v0"], "data.env_id"),
    "train: an env kwarg the env does not take": (["train", "data.env_kwargs.hops=[2]"],
                                                   "data.env_kwargs: RAPO-Math-v0 takes no argument 'hops'"),
    "eval: unknown env": (["eval", "--env", "RAPO-Nope-v0"], "--env"),
    "eval: env kwargs not an object": (["eval", "--env-kwargs", "[1]"], "--env-kwargs"),
    "eval: env kwargs not JSON": (["eval", "--env-kwargs", "{dataset: x}"], "--env-kwargs"),
    "eval: missing dataset file": (["eval", "--env-kwargs", '{"dataset": "math500_test.jsonl"}'], "dataset"),
    "eval: openai without a URL": (["eval", "--policy", "openai"], "--base-url"),
    "eval: missing model folder": (["eval", "--model", MISSING], "--model"),
    "eval: zero questions": (["eval", "--limit", "0"], "--limit"),
    "rollout: missing dataset file": (["rollout", "--env-kwargs", '{"dataset": "nope.jsonl"}'], "dataset"),
    "rollout: unknown env": (["rollout", "--env", "Nope-v0"], "--env"),
    "rollout: typo in env kwargs": (["rollout", "--env-kwargs", '{"datset": "procedural"}'], "did you mean 'dataset'"),
    "buffer build: missing input": (["buffer", "build", "--input", f"{MISSING}.jsonl", "--output", "b.jsonl"],
                                    "--input"),
    "buffer index: missing corpus": (["buffer", "index", "--corpus_path", f"{MISSING}.jsonl", "--index_path", "x"],
                                     "--corpus_path"),
    "buffer serve: missing corpus": (["buffer", "serve", "--corpus_path", f"{MISSING}.jsonl", "--index_path", "x"],
                                     "--corpus_path"),
    "search build-index: missing corpus": (
        ["search", "build-index", "--corpus_path", f"{MISSING}.jsonl", "--index_path", "x"], "--corpus_path"),
    "search serve: missing index": (["search", "serve", "--index_path", f"{MISSING}.index"], "--index_path"),
}


def rapo(*args: str, cwd=None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "RAPO_DEBUG": "", **env})


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """What `rapo` answers to each case, each run in a folder of its own; the cases share nothing, so their processes
    run side by side, one per CPU."""
    folders = {case: tmp_path_factory.mktemp("case") for case in CASES}
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        return dict(zip(CASES, pool.map(lambda case: rapo(*CASES[case][0], cwd=folders[case]), CASES), strict=True))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_user_error_is_one_line_naming_the_setting_with_exit_code_2(case, answers):
    args, setting = CASES[case]
    result = answers[case]
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and setting in lines[0] and lines[0].startswith(f"rapo {args[0]}: error: "), lines


def test_debug_flag_and_variable_bring_the_traceback_back():
    for result in (rapo("--debug", "eval", "--env", "RAPO-Nope-v0"), rapo("eval", "--env", "RAPO-Nope-v0",
                                                                         RAPO_DEBUG="1")):
        assert result.returncode == 1 and "Traceback" in result.stderr and "UsageError" in result.stderr


def test_a_bug_is_reported_as_one_line_that_says_so():
    from rapo_cli.errors import describe

    code, line = describe(KeyError("x"), "train")
    assert code == 1 and "internal error" in line and "--debug" in line and "\n" not in line


def test_a_full_disk_is_one_line_that_says_what_to_free_not_a_bug():
    import errno

    from rapo_cli.errors import describe

    class SafetensorError(Exception):  # safetensors wraps the OS error in its own type, keeping only the text
        pass

    for error in (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "runs/x/checkpoints/model.safetensors"),
                  SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")):
        code, line = describe(error, "train")
        assert code == 2 and "the disk is full" in line and "logging.output_dir" in line and "\n" not in line
    assert describe(OSError(errno.EIO, "Input/output error"), "train")[0] == 1


@pytest.fixture(scope="module")
def cut_short_model(tmp_path_factory, policy_tokenizer_dir) -> str:
    """The embedded model's folder copied with its weights file cut to its first kilobyte (a copy that stopped)."""
    import shutil
    from pathlib import Path

    folder = tmp_path_factory.mktemp("cut_short") / "step_000000"
    shutil.copytree(policy_tokenizer_dir, folder)
    weights = Path(folder, "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:1024])
    return str(folder)


@pytest.mark.parametrize("args", [["eval", "--model", "{model}", "--limit", "1"],
                                  ["train", "model.path={model}", "total_steps=1", "logging.output_dir=run"],
                                  ["export", "{model}", "exported"]], ids=["eval", "train", "export"])
def test_a_model_folder_whose_weights_were_cut_short_is_one_line_naming_it(args, cut_short_model, tmp_path):
    result = rapo(*(arg.format(model=cut_short_model) for arg in args), cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and cut_short_model in lines[0] and "Traceback" not in result.stderr, lines
    assert "header" in lines[0]  # what safetensors found wrong
    assert not (tmp_path / "exported").exists()  # an export that does not load leaves nothing behind
