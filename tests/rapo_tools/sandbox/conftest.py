"""Fixtures of the sandbox tests: one small pooled local sandbox per module, shared by its tests, and the
check every attack ends with (`healthy`)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig
from rapo_tools.sandbox.local_backend import interpreter_roots, scratch_keep_entries
from rapo_tools.sandbox.pool import _shared_pools

# A venv that lives under /tmp (a fresh clone there) is bound back read-only inside the scratch; the clean-up keeps it.
KEPT_IN_TMP = scratch_keep_entries(interpreter_roots(sys.executable)).get("/tmp", [])

# What the next ordinary call prints on a clean worker: its answer, empty scratch directories, no other
# processes in the sandbox (but init, the worker's server and its template, the call's parent), and no SysV
# IPC object in its IPC namespace.
SERVER_PID = "int(next(l for l in open(f'/proc/{os.getppid()}/status') if l.startswith('PPid:')).split()[1])"
"""Sandboxed code's expression (with ``os`` imported) for its worker's server: its parent's parent, the template."""

HEALTH_CHECK = (
    "import os\n"
    f"server = {SERVER_PID}\n"
    "others = [p for p in os.listdir('/proc')\n"
    "          if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid(), server)]\n"
    "ipc = [line for name in ('shm', 'msg', 'sem') for line in open(f'/proc/sysvipc/{name}').read().splitlines()[1:]]\n"
    f"tmp = sorted(set(os.listdir('/tmp')) - {set(KEPT_IN_TMP)!r})\n"
    "print(sum(range(10)), tmp, os.listdir('/dev/shm'), others, ipc)"
)

# Small limits keep every attack bounded and the whole folder fast.
TEST_LIMITS = dict(
    timeout_s=3.0,
    cpu_s=3,
    memory_mb=256,
    max_processes=32,
    max_file_mb=4,
    scratch_mb=16,
    max_output_bytes=20_000,
)


@pytest.fixture(scope="module")
def sandbox():
    """A two-worker local sandbox with the default preloaded modules (numpy, sympy, ...)."""
    with PythonSandbox(SandboxConfig(pool_size=2, **TEST_LIMITS)) as shared:
        yield shared


@pytest.fixture(scope="module")
def single_worker_sandbox():
    """A one-worker local sandbox: consecutive calls land on the same worker, so leaks would show."""
    with PythonSandbox(SandboxConfig(pool_size=1, preload_modules=("math", "numpy"), **TEST_LIMITS)) as shared:
        yield shared


@pytest.fixture(scope="module")
def attack_sandbox():
    """The sandbox under attack: one full worker (numpy, sympy preloaded), small limits."""
    with PythonSandbox(SandboxConfig(pool_size=1, light_pool=False, **TEST_LIMITS)) as shared:
        yield shared


def _status_field(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def _descends_from_this_test(pid: int) -> bool:
    """Whether ``pid`` was started (through any chain) by this pytest process; other rapo
    processes on the host have sandbox workers of their own."""
    while pid > 1:
        pid = _status_field(pid, "PPid") or 0
        if pid == os.getpid():
            return True
    return False


def sandbox_uid_processes(config: SandboxConfig) -> list[int]:
    """Pids of this test's sandboxes running as a sandbox uid (the warm workers and anything the code left behind)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        uid = _status_field(int(name), "Uid")
        if uid is not None and uid >= config.sandbox_uid_base and _descends_from_this_test(int(name)):
            pids.append(int(name))
    return pids


def assert_still_healthy(sandbox: PythonSandbox) -> None:
    """The next ordinary call works, sees a clean scratch, no leftover processes and no IPC objects; on the
    host, nothing the code started is left."""
    result = sandbox.run_sync(HEALTH_CHECK)
    assert result.ok, result.text
    assert result.text == "45 [] [] [] []\n"
    if os.geteuid() == 0:
        # On the host, only the warm workers (full and light, of every sandbox this test process holds) run as
        # a sandbox uid, each a server and its template with the child forked for its next call (or the one of
        # the call just answered, until it is reaped). Killed processes are torn down asynchronously (a big
        # address space takes a while): give them time.
        warm_workers = sum(pool.size for pool, _ in _shared_pools.values())
        deadline = time.monotonic() + 5
        while len(sandbox_uid_processes(sandbox.config)) > 3 * warm_workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sandbox_uid_processes(sandbox.config)) <= 3 * warm_workers


@pytest.fixture(scope="session")
def healthy():
    """`assert_still_healthy`: what every attack ends with."""
    return assert_still_healthy
