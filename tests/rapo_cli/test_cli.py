"""The `rapo` command, run as users run it."""

import json
import subprocess
import sys

from rapo_env.trajectory import read_jsonl


def rapo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_help_lists_the_subcommands():
    result = rapo("--help")
    assert result.returncode == 0
    for command in ("envs", "rollout"):
        assert command in result.stdout


def test_an_unknown_subcommand_is_an_error():
    result = rapo("fly")
    assert result.returncode != 0 and "invalid choice" in result.stderr


def test_envs_lists_math_with_its_tool():
    rows = json.loads(rapo("envs", "--json").stdout)
    math = next(row for row in rows if row["id"] == "RAPO-Math-v0")
    assert math["tools"] == "python" and "procedural" in math["datasets"]


def test_rollout_writes_solved_expert_episodes(tmp_path):
    output = tmp_path / "rollouts.jsonl"
    result = rapo("rollout", "--episodes", "2", "--rollouts-per-question", "2", "--output", str(output),
                  "--env-kwargs", '{"sandbox": "subprocess"}')
    assert result.returncode == 0, result.stderr
    trajectories = read_jsonl(output)
    assert [t.rollout_index for t in trajectories] == [0, 1, 0, 1]
    assert all(t.reward == 1.0 and t.end_reason == "answer" for t in trajectories)
    assert "solved 4/4" in result.stdout
