"""Hostile code through the public API: every attack is contained and the next ordinary call works.

Each attack is bounded (a few thousand forks at most, a few GiB of memory at most, ...), so a
containment failure cannot take the machine down. All of them run on a one-worker sandbox so
that the follow-up call lands on the same worker the attack ran in.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import uuid

import pytest

from .conftest import SERVER_PID

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local sandbox needs Linux")

@pytest.fixture(scope="module")
def target(attack_sandbox):
    """The sandbox under attack: one full worker, small limits."""
    return attack_sandbox


def test_fork_bomb_is_capped_by_the_process_limit(target, healthy):
    code = (
        "import os, time\nstarted = 0\n"
        "for _ in range(3000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(started)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert int(result.text) < target.config.max_processes  # the limit held far below 3000
    healthy(target)


def test_memory_bomb_hits_the_address_space_limit(target, healthy):
    # 48 x 64 MiB = 3 GiB at most, of address space: mapped but not touched, so that a loaded machine
    # reaches the limit as fast as an idle one (zero-filling 256 MiB took over 3 s at a load average of 15)
    code = "import mmap\nblocks = []\nfor _ in range(48):\n    blocks.append(mmap.mmap(-1, 64 << 20))\nlen(blocks)"
    result = target.run_sync(code)
    assert not result.ok and ("MemoryError" in result.text or "Cannot allocate memory" in result.text), result.text
    healthy(target)


def test_infinite_loop_is_stopped(target, healthy):
    result = target.run_sync("while True:\n    pass")
    assert not result.ok
    assert result.timed_out or "CPU" in result.text
    healthy(target)


def test_sleep_past_the_timeout_times_out(target, healthy):
    result = target.run_sync("import time\ntime.sleep(30)")
    assert not result.ok and result.timed_out and "timed out" in result.text
    healthy(target)


def test_hundred_megabytes_of_output_are_cut(target, healthy):
    result = target.run_sync("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)")
    assert result.ok and result.truncated
    assert len(result.text) <= target.config.max_output_bytes
    healthy(target)


def test_background_process_cannot_outlive_the_call(target, healthy):
    code = (
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1)\n"
        "        open('/tmp/survivor', 'w').write('still here')\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('spawned')"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "spawned\n"
    healthy(target)  # no survivors, no file they wrote


class _LocalServer:
    """A TCP server on the host's 127.0.0.1 that records whether anybody connected."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.connected = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            self.connected = True
            connection.close()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.listener.close()


def test_no_network_to_localhost_or_outside(target, healthy):
    server = _LocalServer()
    try:
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {server.port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=2).close()\n"
            "        print('connected', address)\n"
            "    except OSError as error:\n"
            "        print('blocked', type(error).__name__)"
        )
        result = target.run_sync(code)
    finally:
        server.close()
    assert result.ok, result.text
    assert result.text.count("blocked") == 3 and "connected" not in result.text
    assert not server.connected
    healthy(target)


def test_host_secrets_stay_hidden(target, tmp_path, healthy):
    secret = uuid.uuid4().hex
    os.environ["RAPO_TEST_SECRET"] = secret  # the parent's environment must not reach the code
    secret_file = None
    if os.geteuid() == 0 and os.path.isdir("/root"):
        secret_file = f"/root/rapo-sandbox-test-{secret}"
        with open(secret_file, "w") as handle:
            handle.write(secret)
    try:
        code = (
            "import os, glob\nfound = []\n"
            "for path in ['/etc/shadow', *glob.glob('/root/*'), *glob.glob('/proc/*/environ')]:\n"
            "    try:\n"
            "        found.append((path, open(path, 'rb').read().decode('latin-1')))\n"
            "    except OSError:\n"
            "        pass\n"
            "print(repr(dict(os.environ)))\n"
            "print(repr(found))"
        )
        result = target.run_sync(code)
    finally:
        os.environ.pop("RAPO_TEST_SECRET", None)
        if secret_file:
            os.unlink(secret_file)
    assert result.ok, result.text
    assert secret not in result.text
    assert "/etc/shadow" not in result.text and "rapo-sandbox-test" not in result.text
    healthy(target)


def test_writes_outside_the_scratch_directory_fail(target, tmp_path, healthy):
    targets = [str(tmp_path / "escaped.txt"), "/etc/rapo-escaped", "/usr/rapo-escaped", os.path.abspath("escaped.txt"),
               "/rapo-escaped"]
    code = (
        "results = []\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        results.append('written')\n"
        "    except OSError:\n"
        "        results.append('refused')\n"
        "open('/tmp/allowed.txt', 'w').write('fine')\n"
        "print(results)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert result.text.strip() == repr(["refused"] * len(targets))
    assert not any(os.path.exists(path) for path in targets)
    healthy(target)


def test_filling_the_scratch_disk_stops_at_its_size(target, healthy):
    code = (
        "import errno\nwritten = 0\n"
        "try:\n"
        "    for index in range(64):\n"  # 64 x 2 MiB = 128 MiB at most
        "        with open(f'/tmp/fill{index}', 'wb') as handle:\n"
        "            handle.write(b'0' * (2 << 20))\n"
        "        written += 2\n"
        "except OSError as error:\n"
        "    print('stopped', errno.errorcode[error.errno])\n"
        "print(written)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert result.text.startswith("stopped ENOSPC")
    assert int(result.text.split()[-1]) <= target.config.scratch_mb
    healthy(target)


@pytest.mark.parametrize(
    ("code", "call_survives"),
    [
        ("import os\nos.kill(os.getppid(), 9)\nprint('killed')", True),  # the template: the worker retires after
        (f"import os\nos.kill({SERVER_PID}, 9)", False),  # the server, which reads the output
        ("import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)", False),
        ("import os, signal\nos.kill(-1, signal.SIGKILL)", False),
        ("import os, signal\nos.killpg(0, signal.SIGKILL)", False),
    ],
    ids=["kill-template", "kill-server", "killpg-worker", "kill-all", "killpg-self"],
)
def test_killing_the_worker_or_pool_only_costs_that_call(target, code, call_survives, healthy):
    result = target.run_sync(code)
    assert result.ok == call_survives, result.text
    healthy(target)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import os\nos.close(3)\nprint('closed')", "closed\n"),  # the worker waits for the exit instead
        ("import os, time\nprint('early', flush=True)\nos.write(3, bytes([0]))\ntime.sleep(30)", "early\n"),
    ],
    ids=["close-it", "forge-early-end"],
)
def test_the_exit_status_pipe_only_ends_the_call(target, code, expected, healthy):
    # fd 3 is where a call reports its exit status, so that the reply need not wait for the kernel to
    # tear the fork down. Forging it only ends the call early (and kills it), like os._exit would.
    result = target.run_sync(code)
    assert result.ok and result.text == expected
    healthy(target)


def test_ctypes_cannot_regain_privileges_or_make_namespaces(target, healthy):
    clone = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
    if clone is None:
        pytest.skip(f"no clone syscall number known for {platform.machine()}")
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('setuid', libc.setuid(0), os.getuid() == 0)\n"
        "print('ptrace', libc.ptrace(16, os.getppid(), 0, 0))\n"  # PTRACE_ATTACH to the worker
        "print('mount', libc.mount(b'none', b'/usr', b'tmpfs', 0, None))\n"
        "print('user-namespace', libc.unshare(0x10000000))\n"  # CLONE_NEWUSER: would allow unbounded tmpfs
        f"print('clone-user-namespace', libc.syscall({clone}, 0x10000000 | 17, 0, 0, 0, 0))\n"
        "killed_init = libc.kill(1, 9)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert result.text.splitlines() == [
        "setuid -1 False", "ptrace -1", "mount -1", "user-namespace -1", "clone-user-namespace -1"
    ]
    healthy(target)


def test_locked_or_deep_scratch_trees_are_still_removed(target, healthy):
    code = (
        "import os\n"
        "os.makedirs('/tmp/a/b/c')\n"
        "open('/tmp/a/b/c/f', 'w').write('x')\n"
        "os.chmod('/tmp/a/b/c', 0)\n"
        "os.chmod('/tmp/a', 0)\n"
        "os.chdir('/dev/shm')\n"
        "for _ in range(2000):\n"  # deeper than the worker's recursion limit
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "print('locked')"
    )
    assert target.run_sync(code).text == "locked\n"
    healthy(target)
    assert target.run_sync("import os\nos.listdir('/dev/shm')").text == "[]\n"
