"""The README's code blocks run as written on an offline machine: every cheap command and snippet is run here,
and every other one is named in `NOT_RUN` with the reason, so a new README line is either run or explained."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

NOT_RUN = {
    "make run": "trains for minutes (the trainer's tests cover it)",
    "make test": "is this test suite",
    "rapo train": "trains for minutes (the trainer's tests cover it)",
    "rapo eval --model runs/rapo/checkpoints": "needs a trained checkpoint (tests/rapo_cli/test_export.py "
                                               "evaluates and exports one)",
    "rapo export": "needs a trained checkpoint (tests/rapo_cli/test_export.py exports one)",
    "rapo search serve": "serves until stopped (the service tests run it over HTTP)",
    "rapo buffer serve": "serves until stopped (the service tests run it over HTTP)",
    "pip install": "installs packages (GPU node)",
    "python scripts/verl": "the 7B recipe, for a GPU node",
    "RAPO_RETRIEVER=": "the 7B recipe, for a GPU node",
}


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


def commands() -> list[str]:
    """Each shell command of the README's bash blocks, continuation lines joined."""
    joined = [block.replace("\\\n", " ") for block in blocks("bash")]
    return [line.strip() for block in joined for line in block.splitlines() if line.strip()]


def is_run(command: str) -> bool:
    return not any(command.startswith(prefix) for prefix in NOT_RUN)


def shell_env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}


def test_the_first_two_commands_are_make_run_and_make_test():
    assert commands()[:2] == ["make run    # set up .venv and train RAPO on the embedded defaults (CPU, offline)",
                              "make test   # set up .venv and run the test suite"]


def test_every_command_is_run_or_has_a_reason():
    listed = [command for command in commands() if command.split()[0] in ("rapo", "make", "pip", "python")
              or "=" in command.split()[0]]
    assert listed and all(is_run(command) or any(command.startswith(p) for p in NOT_RUN) for command in listed)


@pytest.mark.slow
def test_the_pipeline_commands_run_in_order_offline(tmp_path):
    runnable = [command for command in commands() if is_run(command)]
    assert any(command.startswith("rapo eval") for command in runnable)
    for command in runnable:
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=shell_env(), capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
        assert "Traceback" not in result.stderr, command
    assert (tmp_path / "runs" / "buffer.index").is_file() and (tmp_path / "runs" / "wiki.index").is_file()


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_each_python_snippet_runs(index, tmp_path):
    snippet = blocks("python")[index]
    result = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=shell_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (snippet, result.stderr[-3000:])
