"""Hostile code against the calls that come after it on the same warm worker (the second red team, issue #27):
a call must not change what later calls inherit (limits, scheduling) nor find their predecessors' code and
output in memory. Each attack runs through the public API and ends with the health check."""

from __future__ import annotations

import json
import os
import platform
import secrets
import string
import subprocess
import sys

import pytest

from rapo_tools.sandbox.worker import decode_frames, encode_frame, worker_source

from .conftest import SERVER_PID

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local sandbox needs Linux"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the attacks use x86_64 system call numbers"),
]

# Prints what a call inherits from its worker: limits, scheduling policy, nice value, CPU affinity, I/O priority.
INHERITED = (
    "import ctypes, os, resource\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "names = ('RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_CPU', 'RLIMIT_STACK', 'RLIMIT_NOFILE')\n"
    "limits = [resource.getrlimit(getattr(resource, name)) for name in names]\n"
    "print(limits, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)),\n"
    "      libc.syscall(252, 1, 0))\n"  # ioprio_get(IOPRIO_WHO_PROCESS, self)
)

# Each way the red team changed the worker for every later call, aimed at the call's parent (the template)
# and at the worker's server; prints the errno name of each attempt (or "changed").
CHANGE_THE_WORKER = (
    "import ctypes, errno, os, resource\n"
    f"targets = [os.getppid(), {SERVER_PID}]\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def attempt(change):\n"
    "    try:\n"
    "        if change() == -1:\n"
    "            return errno.errorcode[ctypes.get_errno()]\n"
    "        return 'changed'\n"
    "    except OSError as error:\n"
    "        return errno.errorcode[error.errno]\n"
    "outcomes = []\n"
    "for pid in targets:\n"
    "    for name in ('RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_STACK'):\n"
    "        outcomes.append(attempt(lambda: resource.prlimit(pid, getattr(resource, name), (1, 1))))\n"
    "    outcomes.append(attempt(lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))))\n"
    "    outcomes.append(attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)))\n"
    "    outcomes.append(attempt(lambda: os.sched_setaffinity(pid, {0})))\n"
    "    outcomes.append(attempt(lambda: libc.syscall(251, 1, pid, (3 << 13) | 7)))\n"  # ioprio_set: idle class
    "outcomes.append(attempt(lambda: os.setpriority(os.PRIO_USER, 0, 19)))\n"  # every process of the uid
    "outcomes.append(attempt(lambda: os.setpriority(os.PRIO_PGRP, 0, 19)))\n"
    "outcomes.append(attempt(lambda: libc.syscall(251, 3, 0, (3 << 13) | 7)))\n"  # ioprio_set for the whole uid
    "print(sorted(set(outcomes)))"
)


def test_a_call_cannot_change_the_limits_or_scheduling_of_later_calls(attack_sandbox, healthy):
    before = attack_sandbox.run_sync(INHERITED)
    assert before.ok, before.text
    attack = attack_sandbox.run_sync(CHANGE_THE_WORKER)
    assert attack.ok and attack.text == "['EPERM']\n", attack.text  # the seccomp filter refuses every one
    for _ in range(4):
        after = attack_sandbox.run_sync(INHERITED)
        assert after.ok and after.text == before.text, after.text
    healthy(attack_sandbox)


def test_a_call_can_still_change_its_own_limits_and_scheduling(attack_sandbox, healthy):
    code = (
        "import os, resource\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "resource.prlimit(0, resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))\n"
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
        "os.setpriority(os.PRIO_PROCESS, 0, 5)\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "print(resource.getrlimit(resource.RLIMIT_FSIZE), os.sched_getscheduler(0) == os.SCHED_IDLE)"
    )
    result = attack_sandbox.run_sync(code)
    assert result.ok and result.text == "(4096, 4096) True\n", result.text
    healthy(attack_sandbox)


def test_a_worker_whose_template_limits_changed_retires():
    # The second line, without the seccomp filter: the template checks what it would hand down before each
    # fork, and when a call lowered its limits the worker retires (the pool then starts a fresh one).
    settings = {"preload": [], "scratch_dirs": [], "own_pid_namespace": False, "limits": {}}
    attack = ("import os, resource\n"
              "resource.prlimit(os.getppid(), resource.RLIMIT_FSIZE, (4096, 4096))\nprint('lowered')")
    requests = b"".join(encode_frame({"code": code, "timeout_s": 10, "max_output_bytes": 1000})
                        for code in (attack, "print('next')"))
    completed = subprocess.run([sys.executable, "-I", "-c", worker_source(), json.dumps(settings)],
                               input=requests, capture_output=True, timeout=60)
    frames = decode_frames(completed.stdout)
    assert frames[1]["stdout"] == "lowered\n"
    assert frames[2:] == [{"worker_retiring": True}], frames


@pytest.fixture(params=["light", "full"])
def warm_worker(request, single_worker_sandbox, attack_sandbox):
    """A one-worker sandbox whose consecutive calls land on the same warm worker: a light one (the standard
    library only) or a full one (numpy, sympy)."""
    return single_worker_sandbox if request.param == "light" else attack_sandbox


def _secret() -> str:
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(32))


# Scans every writable mapping of the call's own memory for the secret (given upper-cased, so that this code
# holds it only in the one buffer built here), skipping that buffer and the scan buffer; prints the hits.
SCAN_OWN_MEMORY = (
    "import ctypes\n"
    "upper = {upper!r}\n"
    "needle = bytearray(len(upper))\n"
    "for i, ch in enumerate(upper):\n"
    "    needle[i] = ord(ch) | 0x20\n"
    "buffer = bytearray(1 << 20)\n"
    "skip = [(ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)), len(b)) for b in (needle, buffer)]\n"
    "regions = []\n"
    "for line in open('/proc/self/maps').read().splitlines():\n"
    "    span, perms = line.split()[:2]\n"
    "    if perms.startswith('rw'):\n"
    "        regions.append([int(x, 16) for x in span.split('-')])\n"
    "hits = 0\n"
    "for start, end in regions:\n"
    "    offset = start\n"
    "    while offset < end:\n"
    "        size = min(len(buffer), end - offset)\n"
    "        ctypes.memmove(skip[1][0], offset, size)\n"  # the worker is undumpable: no /proc/self/mem
    "        at = buffer.find(needle, 0, size)\n"
    "        while at >= 0:\n"
    "            address = offset + at\n"
    "            hits += not any(base <= address < base + length for base, length in skip)\n"
    "            at = buffer.find(needle, at + 1, size)\n"
    "        offset += max(size - len(needle), 1)\n"
    "print('hits', hits)"
)


def test_no_call_finds_an_earlier_calls_code_or_output_in_its_memory(warm_worker, healthy):
    secret = _secret()
    padding = "# " + "x" * 2000 + "\n"  # a 2 KB call, as the red team's
    holder = warm_worker.run_sync(
        f"{padding}secret = {secret!r}\nprint(secret)\nimport sys\nprint(secret, file=sys.stderr)")
    assert secret in holder.text
    for _ in range(3):
        scan = warm_worker.run_sync(SCAN_OWN_MEMORY.format(upper=secret.upper()))
        assert scan.ok and scan.text == "hits 0\n", scan.text
    healthy(warm_worker)


def test_the_scan_finds_what_the_call_itself_holds(warm_worker):
    # The scan above would see a leak: the secret held by the scanning call itself is found.
    secret = _secret()
    scan = warm_worker.run_sync(f"held = bytes(ord(c) | 0x20 for c in {secret.upper()!r})\n"
                                + SCAN_OWN_MEMORY.format(upper=secret.upper()))
    assert scan.ok and scan.text != "hits 0\n", scan.text


def test_a_lock_on_a_shared_host_file_does_not_outlive_its_call(attack_sandbox, healthy):
    # flock works on the read-only host files every sandbox shares; a daemon holding one past its call would be a
    # channel to later calls. Every process of a call dies with it, and its locks with it.
    hold = (
        "import fcntl, os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    handle = open('/etc/hostname' if os.path.exists('/etc/hostname') else '/etc/passwd')\n"
        "    fcntl.flock(handle, fcntl.LOCK_EX)\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print('locked')"
    )
    probe = (
        "import fcntl, os\n"
        "handle = open('/etc/hostname' if os.path.exists('/etc/hostname') else '/etc/passwd')\n"
        "try:\n"
        "    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    print('free')\n"
        "except BlockingIOError:\n"
        "    print('held')"
    )
    assert attack_sandbox.run_sync(hold).text == "locked\n"
    result = attack_sandbox.run_sync(probe)
    assert result.ok and result.text == "free\n", result.text
    healthy(attack_sandbox)


def test_the_pid_counter_is_a_channel_the_design_accepts(attack_sandbox, healthy):
    # Documented in docs/sandbox.md: a call that forks N processes moves the pid the next call gets by N (a few
    # bits per call, between calls of the same worker only). This pins the behaviour the docs describe.
    first = attack_sandbox.run_sync("import os\nfor _ in range(20):\n    pid = os.fork()\n"
                                    "    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\nprint(os.getpid())")
    second = attack_sandbox.run_sync("import os\nprint(os.getpid())")
    assert first.ok and second.ok
    assert int(second.text) > int(first.text)
    healthy(attack_sandbox)


def test_no_episode_finds_an_earlier_episodes_secret_with_the_default_settings():
    # The red team's end-to-end case: default gym.make("RAPO-Math-v0") (the local sandbox's default pools), one
    # episode's code holds a secret, later episodes scan their memory for it; every worker is scanned.
    import gymnasium as gym

    import rapo_env  # noqa: F401  (registers the envs)
    from rapo_tools.sandbox import SandboxConfig

    secret = _secret()
    env = gym.make("RAPO-Math-v0", disable_env_checker=True, num_tasks=1)
    try:
        env.reset(seed=0)
        env.step(f"<python>\nsecret = {secret!r}\nprint(secret)\n</python>")
        assert secret in env.unwrapped.transcript
        scans = SandboxConfig().light_workers + 1
        for episode in range(scans):
            env.reset(seed=1 + episode)
            env.step(f"<python>\n{SCAN_OWN_MEMORY.format(upper=secret.upper())}\n</python>")
            transcript = env.unwrapped.transcript
            assert "hits 0" in transcript and secret not in transcript, transcript[-500:]
    finally:
        env.close()
