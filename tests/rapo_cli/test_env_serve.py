"""``rapo env serve``: a real server process that OpenEnv's client and `RemoteEnv` play, and user mistakes that end
in one line with exit code 2, no traceback."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("openenv")

BAD_SETTINGS = {
    "unknown env": (["NoSuchEnv-v0"], "ENV_ID: 'NoSuchEnv-v0' is not a registered env"),
    "kwargs typo": (["RAPO-Math-v0", "--env-kwargs", '{"datset": "procedural"}'], "did you mean 'dataset'"),
    "kwargs not JSON": (["RAPO-Math-v0", "--env-kwargs", "{split: x}"], "--env-kwargs is not valid JSON"),
    "kwargs value the env rejects": (["RAPO-Math-v0", "--env-kwargs", '{"split": "bogus", "sandbox": "subprocess"}'],
                                     "could not be built with --env-kwargs"),
    "retriever neither URL nor default": (["RAPO-Math-v0", "--retriever", "buffer.jsonl"], "--retriever"),
    "retrieval kwargs typo": (["RAPO-Math-v0", "--retriever", "default", "--retrieval-kwargs", '{"tpk": 2}'],
                              "takes no argument 'tpk'"),
    "no sessions": (["RAPO-Math-v0", "--max-sessions", "0"], "--max-sessions"),
}


def rapo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapo_cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAPO_DEBUG": ""})


@pytest.mark.parametrize("case", list(BAD_SETTINGS), ids=list(BAD_SETTINGS))
def test_a_bad_setting_is_one_line_with_exit_code_2(case):
    args, expected = BAD_SETTINGS[case]
    result = rapo("env", "serve", *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("rapo env: error: ") and expected in result.stderr, result.stderr


def test_rapo_env_serve_serves_openenv_and_gym_clients():
    from openenv.core import GenericEnvClient

    from rapo_env.remote import RemoteEnv
    from rapo_tools.serving import free_port, serve_command

    port = free_port()
    command = [sys.executable, "-m", "rapo_cli", "env", "serve", "RAPO-Math-v0", "--port", str(port),
               "--max-sessions", "4", "--env-kwargs", '{"num_tasks": 4, "sandbox": "subprocess"}']
    with serve_command(command, port, startup_timeout_s=120) as url:
        with GenericEnvClient(base_url=url).sync() as client:
            assert client.reset(task_index=0).observation["system_prompt"]
            step = client.step({"text": "<python>print(6 * 7)</python>"})
            assert step.observation["text"] == " <result>\n42\n</result>"
        env = RemoteEnv(url)
        try:
            env.reset(seed=0)
            observation, reward, terminated, truncated, _ = env.step("<answer>\\boxed{0}</answer>")
            assert (observation, terminated, truncated) == ("", True, False) and reward <= 0
        finally:
            env.close()
