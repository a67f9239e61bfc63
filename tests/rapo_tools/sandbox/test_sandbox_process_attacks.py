"""Hostile code against the processes around it: the worker, other sandboxes, /proc and /sys, inherited
file descriptors. Each attack is bounded and ends with the health check on the worker it ran in.
"""

from __future__ import annotations

import os

import pytest

from .conftest import SERVER_PID

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local sandbox needs Linux")


@pytest.fixture(scope="module")
def target(attack_sandbox):
    return attack_sandbox


def test_other_sandboxes_and_host_processes_cannot_be_seen_or_signalled(sandbox, healthy):
    # Every pid the code can signal (or is refused to) lives in its own pid namespace: its worker, bwrap's
    # init, itself. The other worker of this two-worker pool and every host process answer ESRCH.
    code = (
        "import os\nreachable = []\n"
        "for pid in range(1, 70_000):\n"
        "    try:\n"
        "        os.kill(pid, 0)\n"
        "        reachable.append(pid)\n"
        "    except PermissionError:\n"
        "        reachable.append(pid)\n"
        "    except ProcessLookupError:\n"
        "        pass\n"
        "visible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(reachable == visible, len(visible) <= 4)"
    )
    result = sandbox.run_sync(code)
    assert result.ok and result.text == "True True\n", result.text
    healthy(sandbox)


def test_stopping_the_worker_only_costs_that_call(target, healthy):
    result = target.run_sync(f"import os, signal\nos.kill({SERVER_PID}, signal.SIGSTOP)\nprint('stopped it')")
    assert not result.ok  # the call is abandoned once the worker stops answering; a fresh worker takes over
    healthy(target)


def test_stopping_the_template_costs_nothing(target, healthy):
    # The call's parent is the worker's template: the clean-up continues it before the next fork.
    result = target.run_sync("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint('stopped it')")
    assert result.ok and result.text == "stopped it\n", result.text
    healthy(target)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_delayed_signal_to_the_worker_does_not_reach_the_next_call(target, healthy, signal_name):
    # A process in a session of its own signals the worker just after the reply: the worker kills every leftover
    # before it takes the next call, and should the signal win that race, the next call goes to a fresh worker.
    # (A SIGSTOP that wins it costs the next call too: a stopped worker looks like a slow one until the deadline.)
    code = (
        "import os, signal, time\nworker = os.getppid()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(0.05)\n"
        f"    os.kill(worker, signal.{signal_name})\n"
        "    os._exit(0)\n"
        "print('armed')"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "armed\n", result.text
    healthy(target)


def test_only_the_calls_own_pipes_are_inherited(target, healthy):
    result = target.run_sync("import os\nsorted(int(fd) for fd in os.listdir('/proc/self/fd'))")
    assert result.ok, result.text
    assert eval(result.text)[:4] == [0, 1, 2, 3] and len(eval(result.text)) == 5  # + the listing's own fd
    healthy(target)


def test_the_worker_cannot_be_read_or_written_through_proc(target, healthy):
    # Same uid as the worker, even after making itself dumpable again: the worker stays undumpable.
    code = (
        "import ctypes, os\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"  # PR_SET_DUMPABLE 1 for ourselves
        "outcomes = []\n"
        "for path, mode in [(f'/proc/{os.getppid()}/mem', 'rb'), (f'/proc/{os.getppid()}/environ', 'rb'),\n"
        "                   (f'/proc/{os.getppid()}/fd/0', 'rb'), ('/proc/1/root/etc/hostname', 'rb'),\n"
        "                   ('/proc/sys/vm/drop_caches', 'w'), ('/proc/sysrq-trigger', 'w'),\n"
        "                   ('/sys/fs/cgroup/memory/cgroup.procs', 'w'), ('/proc/self/oom_score_adj', 'w')]:\n"
        "    try:\n"
        "        with open(path, mode) as handle:\n"
        "            handle.write('-1000') if 'w' in mode else handle.read(16)\n"
        "        outcomes.append((path.split('/')[-1], 'done'))\n"
        "    except OSError as error:\n"
        "        outcomes.append((path.split('/')[-1], 'refused'))\n"
        "print(outcomes)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    outcomes = dict(eval(result.text))
    # Raising one's own OOM score is allowed and harmless; lowering it to -1000 is not.
    assert all(outcome == "refused" for outcome in outcomes.values()), outcomes
    healthy(target)


def test_no_terminal_to_inject_input_into(target, healthy):
    code = "try:\n    open('/dev/tty', 'w')\n    print('tty')\nexcept OSError as error:\n    print(error.errno)"
    result = target.run_sync(code)
    assert result.ok and result.text == "6\n", result.text  # ENXIO: no controlling terminal (a new session)
    healthy(target)


def test_a_thread_bomb_is_capped_by_the_process_limit(target, healthy):
    code = (
        "import threading, time\nstarted = 0\n"
        "for _ in range(2000):\n"
        "    try:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "        started += 1\n"
        "    except RuntimeError:\n"
        "        break\n"
        "print(started)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert int(result.text) < target.config.max_processes
    healthy(target)
