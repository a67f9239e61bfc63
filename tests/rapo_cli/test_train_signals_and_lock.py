"""`rapo train` under Ctrl-C and SIGTERM in every phase, and one run per folder (issue #29).

The runs are real `rapo train` processes on a tiny random Llama (the embedded tokenizer) and four procedural
questions; each test waits for the log line of the phase it interrupts, never for a fixed time."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time


WAIT_S = 600  # the most a phase's log line may take on a loaded machine (a bound, not a timing)


def start(command: list[str], cwd) -> subprocess.Popen:
    env = {**os.environ, "RAPO_DEBUG": "", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_line(process: subprocess.Popen, needle: str) -> list[str]:
    """The output lines up to the first that contains ``needle`` (fails if the process ends first)."""
    lines: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 5)
        if not ready:
            continue
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    process.kill()
    raise AssertionError(f"no line with {needle!r}:\n{''.join(lines)[-3000:]}")


def finish(process: subprocess.Popen) -> tuple[int, str]:
    output, _ = process.communicate(timeout=WAIT_S)
    return process.returncode, output


def trainer_state(output_dir) -> dict:
    checkpoints = sorted((output_dir / "checkpoints").glob("step_*"))
    assert checkpoints, f"no checkpoint in {output_dir}"
    return json.loads((checkpoints[-1] / "trainer_state.json").read_text())


def test_sigint_during_the_warm_up_stops_after_the_current_step_and_saves_a_resumable_checkpoint(
        tiny_run, tmp_path):
    output_dir = tmp_path / "run"
    process = start(tiny_run(output_dir, "sft_steps=100000", "sft_batch_size=1",
                             "num_expert_episodes=2"), tmp_path)
    wait_for_line(process, "warm-up: behaviour cloning")
    process.send_signal(signal.SIGINT)
    code, output = finish(process)
    assert code == 130, output[-3000:]
    assert ("SIGINT: stopping after the current warm-up step and saving a checkpoint; the next run redoes the warm-up"
            in output)
    assert "Traceback" not in output
    state = trainer_state(output_dir)
    assert state["warmup_done"] is False  # so the next run does the warm-up again


def test_sigterm_during_the_step_0_evaluation_stops_it_and_keeps_the_warm_up(tiny_run, tmp_path):
    output_dir = tmp_path / "run"
    process = start(tiny_run(output_dir, "sft_steps=1", "sft_batch_size=1", "num_expert_episodes=2",
                             "evaluation.heldout_tasks=5000", "evaluation.max_eval_tokens=512"), tmp_path)
    wait_for_line(process, "held-out evaluation at step 0")
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == 130, output[-3000:]
    assert "SIGTERM: stopping the held-out evaluation now and saving a checkpoint" in output
    state = trainer_state(output_dir)
    assert state["step"] == 0 and state["warmup_done"] is True  # the next run skips the warm-up


def test_a_second_run_in_the_same_folder_is_refused_naming_the_folder_and_the_fix(tiny_run, tmp_path):
    from rapo_agents.run_control import RunFolderLock

    output_dir = tmp_path / "run"
    with RunFolderLock(output_dir):  # as a first `rapo train` holds it
        result = subprocess.run(tiny_run(output_dir), capture_output=True, text=True,
                                timeout=WAIT_S, cwd=tmp_path, env={**os.environ, "RAPO_DEBUG": ""})
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapo train: error: "), lines
    assert str(output_dir) in lines[0] and "logging.output_dir=" in lines[0]
