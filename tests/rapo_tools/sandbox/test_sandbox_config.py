"""Configuration: from dicts, YAML, names; validation; reaching the sandbox through the tool and gym."""

from __future__ import annotations

import pytest
import yaml

from rapo_tools.sandbox import PythonSandbox, SandboxConfig, SandboxUnavailableError
from rapo_tools.sandbox.local_backend import LocalSandboxExecutor


def test_default_backend_is_the_isolated_local_one():
    assert SandboxConfig().backend == "local"


def test_from_yaml_mapping():
    text = """
    backend: local
    timeout_s: 4
    memory_mb: 512
    pool_size: 3
    preload_modules: [math, fractions]
    """
    config = SandboxConfig.from_value(yaml.safe_load(text))
    assert config.timeout_s == 4 and config.memory_mb == 512 and config.workers == 3
    assert config.light_workers == 3  # the pool size unless light_pool_size says otherwise
    assert config.preload_modules == ("math", "fractions")
    hash(config)  # hashable: equal configs share one pool


def test_light_pool_size_overrides_the_default():
    assert SandboxConfig(pool_size=3, light_pool_size=2).light_workers == 2


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"backend": "vm"}, ValueError),
        ({"timeout": 3}, ValueError),
        ({"timeout_s": 0}, ValueError),
        ({"memory_mb": -1}, ValueError),
        ({"pool_size": 0}, ValueError),
        ({"light_pool_size": 0}, ValueError),
        ({"preload_modules": "numpy"}, ValueError),
        ({"scratch_inodes": 0}, ValueError),
        ({"max_code_bytes": 0}, ValueError),
        (3.5, TypeError),
    ],
)
def test_bad_settings_get_clear_errors(value, error):
    with pytest.raises(error):
        SandboxConfig.from_value(value)


def test_code_limit_must_fit_the_worker_protocol():
    with pytest.raises(ValueError, match="max_code_bytes must be at most 8388608.*64 MiB"):
        SandboxConfig(max_code_bytes=16 << 20)


def test_missing_isolation_fails_loudly():
    with pytest.raises(SandboxUnavailableError, match="allow_unsandboxed"):
        PythonSandbox({"bwrap_path": "/nonexistent/bwrap", "pool_size": 1})


def test_unsandboxed_mode_warns_and_still_runs_code():
    config = {"bwrap_path": "/nonexistent/bwrap", "allow_unsandboxed": True, "pool_size": 1,
              "preload_modules": ["math"], "timeout_s": 1}
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        sandbox = PythonSandbox(config)
    try:
        assert not sandbox._executor.isolated
        assert sandbox.run_sync("import os\nopen('f.txt', 'w').write('x')\nsum(range(5))").text == "10\n"
        assert sandbox.run_sync("import os\nos.listdir('.')").text == "[]\n"  # the private scratch is emptied
        assert sandbox.run_sync("import time\ntime.sleep(10)").timed_out
    finally:
        sandbox.close()


def test_executors_with_equal_configs_share_one_pool():
    from rapo_tools.sandbox import pool

    config = SandboxConfig(pool_size=1, preload_modules=("math",), timeout_s=2.5)
    key = ("LocalSandboxExecutor", config, True)  # stdlib-only code runs in the light pool
    first, second = PythonSandbox(config), PythonSandbox(config)
    try:
        assert first.run_sync("1").ok and second.run_sync("2").ok
        assert first._executor._pools[True] is second._executor._pools[True]
        assert pool._shared_pools[key][1] == 2
    finally:
        first.close()
        assert key in pool._shared_pools  # still used by the second
        second.close()
    assert key not in pool._shared_pools


def test_code_importing_third_party_modules_runs_in_full_workers(single_worker_sandbox):
    executor = single_worker_sandbox._executor
    assert single_worker_sandbox.run_sync("import fractions\nfractions.Fraction(1, 3) * 3").text == "Fraction(1, 1)\n"
    assert set(executor._pools) == {True}
    assert single_worker_sandbox.run_sync("import numpy as np\nprint(np.ones(3).sum())").text == "3.0\n"
    assert set(executor._pools) == {True, False}
    # The light worker can still import anything; it is only slower to do so.
    assert single_worker_sandbox.run_sync("m = __import__('numpy')\nprint(m.zeros(2).size)").text == "2\n"


def test_python_tool_uses_the_local_sandbox_by_default():
    from rapo_tools.python_tool import PythonTool

    with PythonTool(sandbox={"pool_size": 1, "preload_modules": ["math"]}) as tool:
        assert isinstance(tool._executor, LocalSandboxExecutor)
        result = tool.call("import math\nmath.factorial(6)")
        assert result.ok and result.text == "720\n" and result.latency_s > 0


def test_gym_make_passes_the_sandbox_settings():
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("rapo_env")
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox={"pool_size": 1, "preload_modules": ["math"], "timeout_s": 2})
    try:
        tool = env.unwrapped.tools["python"]
        assert tool.config.timeout_s == 2 and tool.config.backend == "local"
        env.reset(seed=0)
        _, _, _, _, info = env.step("<python>\nprint(6 * 7)\n</python>")
        assert info["tool"] == "python" and info["tool_ok"]
    finally:
        env.close()


def test_a_forked_process_starts_its_own_workers(single_worker_sandbox):
    """As in a forked vector-env worker: the child must not talk to the parent's workers."""
    import os
    import signal

    assert single_worker_sandbox.run_sync("1 + 1").ok  # the parent's pool is running
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hang in the child must not hang the suite
        try:
            text = single_worker_sandbox.run_sync("import os\nprint(os.getpid() > 1, 6 * 7)").text
        except BaseException as error:  # report anything to the parent
            text = repr(error)
        os.write(write_end, text.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        text = reader.read().decode()
    os.waitpid(pid, 0)
    assert text == "True 42\n"
    assert single_worker_sandbox.run_sync("3 * 3").text == "9\n"  # the parent's pool still works


def test_async_vector_env_workers_run_the_local_sandbox():
    """Env worker processes are daemons (no multiprocessing children): the pool uses plain subprocesses."""
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("rapo_env")
    envs = gym.make_vec("RAPO-Math-v0", num_envs=2, vectorization_mode="async", num_tasks=2,
                        sandbox={"preload_modules": ["math"], "timeout_s": 5})
    try:
        envs.reset(seed=0)
        observations, _, _, _, infos = envs.step(["<python>\nimport math\nprint(math.factorial(5))\n</python>"] * 2)
        assert all(o.startswith(" <result>\n120\n") for o in observations), observations
        assert list(infos["tool_ok"]) == [True, True]
    finally:
        envs.close()
