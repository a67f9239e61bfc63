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
    "kill %": "stops the services that the lines above start in the background (not started by this test)",
    "python -m rapo_agents.policies.openai_server": "serves until stopped: "
                                                    "test_the_local_openai_server_serves_the_readmes_eval runs it",
    "rapo eval --policy openai": "needs the server of the line above: "
                                 "test_the_local_openai_server_serves_the_readmes_eval runs both",
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


def command_starting(prefix: str) -> str:
    return next(command for command in commands() if command.startswith(prefix))


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


def run_in(folder: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=folder, env=shell_env(), capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[Path, list[tuple[str, subprocess.CompletedProcess]]]:
    """The README's runnable commands, run in order in a fresh folder up to the first that fails: the folder and
    each command's result (the snippets that read the pipeline's files run in that folder)."""
    folder, results = tmp_path_factory.mktemp("pipeline"), []
    for command in (command for command in commands() if is_run(command)):
        results.append((command, run_in(folder, command)))
        if results[-1][1].returncode != 0:
            break
    return folder, results


@pytest.mark.slow
def test_the_pipeline_commands_run_in_order_offline(pipeline):
    folder, results = pipeline
    for command, result in results:
        assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
        assert "Traceback" not in result.stderr, command
    assert [command for command, _ in results] == [command for command in commands() if is_run(command)]
    assert any(command.startswith("rapo eval") for command, _ in results)
    assert (folder / "runs" / "buffer.index").is_file() and (folder / "runs" / "wiki.index").is_file()


def test_the_readme_says_to_activate_the_venv_first():
    assert "source .venv/bin/activate" in README and ".venv/bin/rapo" in README


def test_the_pipelines_services_run_in_the_background_on_ports_that_do_not_collide():
    from rapo_cli.buffer import add_serve_arguments
    from rapo_cli.search import SEARCH_PORT

    for prefix in ("rapo search serve", "rapo buffer serve"):
        assert command_starting(prefix).split("#")[0].rstrip().endswith("&"), prefix
    assert any(command.startswith("kill %1 %2") for command in commands())
    import argparse

    buffer = argparse.ArgumentParser()
    add_serve_arguments(buffer)
    buffer_port = buffer.parse_args(["--corpus_path", "b", "--index_path", "i"]).port
    assert len({SEARCH_PORT, buffer_port, 8000}) == 3  # search, retrieval and vLLM's port


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_local_openai_server_serves_the_readmes_eval(tmp_path):
    import time

    import httpx

    port = str(free_port())
    server_line = command_starting("python -m rapo_agents.policies.openai_server").split("#")[0].strip()
    eval_line = command_starting("rapo eval --policy openai").replace("8000", port)
    assert server_line.endswith("&")
    server = subprocess.Popen(["bash", "-c", "exec " + server_line.rstrip("&").replace("8000", port)], cwd=tmp_path,
                              env=shell_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        assert server.poll() is None, server.stderr.read()[-3000:]
        result = run_in(tmp_path, eval_line)
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
        assert "2 rollouts" in result.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_each_python_snippet_runs(index, tmp_path, request):
    snippet = blocks("python")[index]
    # A snippet that reads the pipeline's buffer runs where the pipeline wrote it.
    folder = request.getfixturevalue("pipeline")[0] if "runs/buffer" in snippet else tmp_path
    result = subprocess.run([sys.executable, "-c", snippet], cwd=folder, env=shell_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (snippet, result.stderr[-3000:])
