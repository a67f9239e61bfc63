"""Code strings that break parsers, protocols or process plumbing: `PythonSandbox.run` never raises for any of
them, each gets a result that says what happened, and the next ordinary call works. Run on both the local and
the subprocess backends; the last tests attack the subprocess backend's own promises (environment, leftovers).
"""

from __future__ import annotations

import os
import random
import time
import uuid

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the sandboxes need Linux")

SUBPROCESS_LIMITS = dict(backend="subprocess", timeout_s=3.0, max_output_bytes=20_000, max_code_bytes=1 << 20)

# name -> code; none of them may make the host raise
HOSTILE = {
    "unary-chain": "import os\n" + "-" * 15000 + "1",  # MemoryError in the host-side parse of the old code
    "not-chain": "not " * 100_000 + "1",
    "deep-brackets": "import os\n" + "[" * 5000 + "]" * 5000,
    "deep-parentheses": "(" * 200_000,
    "deep-calls": "import os\n" + "f(" * 3000 + ")" * 3000,
    "lone-surrogate": "print('\ud800')",
    "surrogate-in-import": "import \udcff",
    "nul-byte": "print(1)\x00",
    "only-newlines": "\n" * 100_000,
    "long-line": "x = " + "1 + " * 200_000 + "1",
    "binary-junk": "".join(chr(random.Random(7).randrange(1, 0x2FFF)) for _ in range(5000)),
    "fake-protocol-frame": "import sys\nsys.stdout.buffer.write(b'\\x00\\x00\\x00\\x0f{\"ready\": true}')",
}


@pytest.fixture(scope="module", params=["local", "subprocess"])
def any_backend(request, attack_sandbox):
    if request.param == "local":
        yield attack_sandbox
    else:
        with PythonSandbox(SandboxConfig(**SUBPROCESS_LIMITS)) as shared:
            yield shared


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_strings_get_a_result_never_an_exception(any_backend, name):
    result = any_backend.run_sync(HOSTILE[name])  # must not raise
    assert isinstance(result.text, str) and result.text
    assert "exited with status 70" not in result.text  # the worker's plumbing code: never shown any more
    assert "Traceback" not in result.text or 'File "<code>"' in result.text  # only the user's frames
    assert any_backend.run_sync("sum(range(10))").text == "45\n"


def test_parse_failures_say_what_happened(any_backend):
    result = any_backend.run_sync("import os\n" + "-" * 15000 + "1")
    assert not result.ok
    assert "could not parse the code" in result.text and "Error" in result.text


def test_code_over_the_size_limit_is_refused_with_its_size(any_backend):
    limit = any_backend.config.max_code_bytes
    code = "x = 1\n" + "#" * limit
    result = any_backend.run_sync(code)
    assert not result.ok and result.error == "code_too_large"
    assert result.text == f"code too large ({len(code)} bytes, limit {limit})"
    assert any_backend.run_sync("sum(range(10))").text == "45\n"


def test_multibyte_code_is_measured_in_utf8_bytes(any_backend):
    limit = any_backend.config.max_code_bytes
    code = "é" * (limit // 2 + 1)  # fewer characters than the limit, more bytes
    assert any_backend.run_sync(code).text == f"code too large ({2 * len(code)} bytes, limit {limit})"


def test_code_that_is_not_a_string_is_a_clear_caller_error(any_backend):
    with pytest.raises(TypeError, match="code must be a str, not bytes"):
        any_backend.run_sync(b"print(1)")


def test_huge_argv_and_environment_are_refused_by_the_kernel(any_backend):
    code = (
        "import os\n"
        "try:\n"
        "    os.execve('/bin/true', ['true'] + ['x' * 100_000] * 400, {'BIG': 'y' * 1_000_000})\n"
        "except OSError as error:\n"
        "    print(error.strerror)"
    )
    result = any_backend.run_sync(code)
    assert result.ok and result.text == "Argument list too long\n"
    assert any_backend.run_sync("sum(range(10))").text == "45\n"


@pytest.fixture(scope="module")
def subprocess_sandbox():
    with PythonSandbox(SandboxConfig(**SUBPROCESS_LIMITS)) as shared:
        yield shared


def test_subprocess_backend_passes_only_an_allow_list_of_the_environment(subprocess_sandbox):
    secret = uuid.uuid4().hex
    os.environ["RAPO_TEST_API_KEY"] = secret
    try:
        result = subprocess_sandbox.run_sync("import os\nprint(sorted(os.environ), list(os.environ.values()))")
    finally:
        os.environ.pop("RAPO_TEST_API_KEY")
    assert result.ok, result.text
    assert secret not in result.text and "RAPO_TEST_API_KEY" not in result.text
    names = eval(result.text.split("] [")[0] + "]")  # the sorted names the code printed
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "HOME", "USER", "LOGNAME", "TERM",
                          "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"}


def _processes_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if name.isdigit() and marker.encode() in handle.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


def _survivors(marker: str, patience_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + patience_s
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# A daemon in a session of its own (setsid, double fork), and one in the code's own group: neither may outlive it.
ESCAPE = (
    "import os, subprocess, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execvp('sleep', ['sleep', '{marker}'])\n"
    "    os._exit(0)\n"
    "subprocess.Popen(['sleep', '{marker}1'])\n"
    "time.sleep(0.2)\n"
    "print('spawned')\n"
)


def _marker() -> str:
    return f"{random.randrange(20, 30)}.{random.randrange(10**8)}"  # a sleep of 20-30 s with a unique argument


def test_subprocess_backend_leaves_no_process_behind(subprocess_sandbox):
    marker = _marker()
    result = subprocess_sandbox.run_sync(ESCAPE.format(marker=marker))
    assert result.ok and result.text == "spawned\n", result.text
    assert _survivors(marker) == []


def test_subprocess_backend_leaves_no_process_behind_a_timeout(subprocess_sandbox):
    marker = _marker()
    result = subprocess_sandbox.run_sync(ESCAPE.format(marker=marker) + "time.sleep(30)")
    assert result.timed_out
    assert _survivors(marker) == []


def test_subprocess_backend_leaves_no_process_behind_an_output_flood(subprocess_sandbox):
    marker = _marker()
    result = subprocess_sandbox.run_sync(ESCAPE.format(marker=marker) + "while True:\n    print('x' * 10_000)")
    assert result.truncated
    assert _survivors(marker) == []


def test_subprocess_backend_leaves_no_process_behind_when_the_code_exits_hard(subprocess_sandbox):
    marker = _marker()
    result = subprocess_sandbox.run_sync(ESCAPE.format(marker=marker) + "os._exit(3)")
    assert not result.ok and "status 3" in result.text
    assert _survivors(marker) == []


def test_subprocess_backend_honours_the_memory_limit(subprocess_sandbox):
    budget = subprocess_sandbox.config.memory_mb
    code = (
        "def allocate(mib):\n"
        "    try:\n"
        "        return len(bytearray(mib << 20)) >> 20\n"
        "    except MemoryError:\n"
        "        return 'MemoryError'\n"
        f"print(allocate(64), allocate({budget + 64}))"  # the refusal costs nothing; 64 MiB is quick to fill
    )
    result = subprocess_sandbox.run_sync(code)
    assert result.ok and result.text == "64 MemoryError\n", result.text
