"""The local sandbox behaves like the reference tool: REPL output, tracebacks, timeouts, flags."""

from __future__ import annotations

import sys

import pytest

from rapo_tools.sandbox.local_backend import interpreter_roots, scratch_keep_entries

# A venv that lives under /tmp (a fresh clone there) is bound back read-only inside the scratch; the clean-up keeps it.
KEPT_IN_TMP = scratch_keep_entries(interpreter_roots(sys.executable)).get("/tmp", [])


def test_final_bare_expression_is_printed(sandbox):
    result = sandbox.run_sync("x = 6\nx * 7")
    assert result.ok and result.text == "42\n"
    assert not result.truncated and not result.timed_out and result.error is None


def test_stdout_is_returned_on_success(sandbox):
    result = sandbox.run_sync("for i in range(3):\n    print('line', i)")
    assert result.ok and result.text == "line 0\nline 1\nline 2\n"


def test_preloaded_modules_work_and_solve(sandbox):
    result = sandbox.run_sync("import sympy\nx = sympy.symbols('x')\nsympy.solve(x**2 - 4, x)")
    assert result.ok and result.text.strip() == "[-2, 2]"
    assert sandbox.run_sync("import numpy as np\nint(np.arange(5).sum())").text == "10\n"


def test_failure_returns_the_useful_traceback_tail(sandbox):
    result = sandbox.run_sync("def f(v):\n    return 1 / v\n\nprint('before')\nf(0)")
    assert not result.ok and result.error == "execution_error"
    assert result.text.startswith("before\n")
    assert 'File "<code>", line 2, in f' in result.text
    assert result.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "worker" not in result.text and "site-packages" not in result.text  # only the user's frames


def test_syntax_error_is_reported(sandbox):
    result = sandbox.run_sync("print(1")
    assert not result.ok and "SyntaxError" in result.text


def test_timeout_has_a_clear_message_and_flag(sandbox):
    result = sandbox.run_sync("import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert not result.ok and result.timed_out and result.error == "timeout"
    assert result.text == "Execution timed out after 3 seconds."


def test_output_is_capped_and_marked_truncated(sandbox):
    result = sandbox.run_sync("print('y' * 50_000)")
    assert result.ok and result.truncated
    assert set(result.text) == {"y"}


def test_no_state_survives_between_calls(single_worker_sandbox):
    first = single_worker_sandbox.run_sync("leak = 41\nimport math\nmath.pi = 3\nopen('note.txt', 'w').write('x')")
    assert first.ok
    second = single_worker_sandbox.run_sync(
        "import math, os\n"
        f"print('leak' in globals(), math.pi > 3.1, sorted(set(os.listdir('.')) - {set(KEPT_IN_TMP)!r}))"
    )
    assert second.ok and second.text == "False True []\n"


@pytest.mark.parametrize(
    ("code", "ok", "expected"),
    [
        ("print('bye')\nimport sys\nsys.exit(0)", True, "bye\n"),
        ("import sys\nsys.exit(3)", False, "status 3"),
        ("import sys\nsys.exit('fatal: gave up')", False, "fatal: gave up"),
        ("import os\nos._exit(0)", True, "(no output"),
        ("import os\nos._exit(7)", False, "status 7"),
    ],
)
def test_exits_inside_the_code(single_worker_sandbox, code, ok, expected):
    result = single_worker_sandbox.run_sync(code)
    assert result.ok is ok and expected in result.text
    assert single_worker_sandbox.run_sync("1 + 1").text == "2\n"


def test_async_api_runs_calls_concurrently(sandbox):
    import asyncio

    async def many():
        return await asyncio.gather(*(sandbox.run(f"{i} * {i}") for i in range(6)))

    results = asyncio.run(many())
    assert [r.text for r in results] == [f"{i * i}\n" for i in range(6)]


def test_code_that_closes_its_output_may_keep_working(sandbox):
    code = "import os, time\nprint('first', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(0.3)\nos._exit(0)"
    result = sandbox.run_sync(code)
    assert result.ok and result.text == "first\n"


def test_code_that_exits_at_once_is_reported_by_its_own_status_call_after_call(single_worker_sandbox):
    # The child can exit and be reaped before the worker looks at it: each call must still read as the code's
    # own exit, never as a lost worker.
    results = [single_worker_sandbox.run_sync("import os\nos._exit(7)") for _ in range(150)]
    assert [r.error for r in results if "status 7" not in r.text] == []
