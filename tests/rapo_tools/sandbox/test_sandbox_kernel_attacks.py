"""Hostile code against the kernel interface: the seccomp filter refuses what isolation must not allow.

Every refusal is asserted with its errno (EPERM from the filter, not a missing capability), through the
public API, on a one-worker sandbox, and followed by the health check: the host is unaffected, nothing
reaches the next call and the next ordinary call works. A call that the filter failed to stop would
still be bounded by the call's limits (time, processes, memory).
"""

from __future__ import annotations

import os
import platform

import pytest

from rapo_tools.sandbox.seccomp import sandbox_filter

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local sandbox needs Linux"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the attacks use x86_64 system call numbers"),
]

# Runs in the sandbox: ``attempt(number, *args)`` makes a raw system call and returns "ok" or the errno's name.
ATTEMPT = (
    "import ctypes, errno, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "buffer = ctypes.create_string_buffer(4096)\n"
    "BUF = ctypes.addressof(buffer)\n"
    "kept = []\n"
    "def word(value):\n"  # bytes become a pointer to a copy of them
    "    if isinstance(value, bytes):\n"
    "        kept.append(ctypes.create_string_buffer(value))\n"
    "        return ctypes.c_long(ctypes.addressof(kept[-1]))\n"
    "    return ctypes.c_long(value)\n"
    "def attempt(number, *args):\n"
    "    ctypes.set_errno(0)\n"
    "    result = libc.syscall(ctypes.c_long(number), *[word(a) for a in args])\n"
    "    return 'ok' if result != -1 else errno.errorcode[ctypes.get_errno()]\n"
)

CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, SIGCHLD = 0x10000000, 0x20000, 0x40000000, 0x20000000, 17

# class -> {what: (system call number, arguments...)}; BUF is a writable 4 KiB buffer in the sandbox
REFUSED = {
    "namespaces": {
        "unshare-user": (272, CLONE_NEWUSER),
        "unshare-user-mount-net": (272, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET),
        "unshare-mount": (272, CLONE_NEWNS),
        "clone-user": (56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
        "clone-pid-mount": (56, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0),
        "setns": (308, 0, 0),
    },
    "mounts": {
        "mount-tmpfs": (165, "b'none'", "b'/tmp'", "b'tmpfs'", 0, 0),
        "umount": (166, "b'/proc'", 0),
        "fsopen": (430, "b'tmpfs'", 0),
        "open_tree": (428, -100, "b'/'", 1),
        "pivot_root": (155, "b'/tmp'", "b'/tmp'"),
        "chroot": (161, "b'/tmp'"),
    },
    "state-that-outlives-a-call": {
        "shmget": (29, 0, 4096, 0o1600),
        "msgget": (68, 0, 0o1600),
        "semget": (64, 0, 1, 0o1600),
        "mq_open": (240, "b'rapo'", 0o100 | 2, 0o600, 0),
        "add_key": (248, "b'user'", "b'rapo'", "b'secret'", 6, -4),
        "keyctl-user-keyring": (250, 0, -4, 1),
    },
    "memory-outside-the-limit": {
        "memfd_create": (319, "b'rapo'", 0),
        "memfd_secret": (447, 0),
    },
    "exploit-primitives": {
        "io_uring_setup": (425, 8, "BUF"),
        "userfaultfd": (323, 0),
        "bpf-prog-load": (321, 5, "BUF", 128),
        "perf_event_open": (298, "BUF", 0, -1, -1, 0),
        "ptrace-traceme": (101, 0, 0, 0, 0),
        "ptrace-attach-worker": (101, 16, "os.getppid()", 0, 0),
        "process_vm_readv": (310, "os.getppid()", "BUF", 1, "BUF", 1, 0),
        "kcmp": (312, "os.getpid()", "os.getppid()", 0, 0, 0),
        "pidfd_getfd": (438, 0, 0, 0),
        "personality-read-implies-exec": (135, 0x0400000),
        "personality-no-randomize": (135, 0x0040000),
        "finit_module": (313, 0, "b''", 0),
        "kexec_load": (246, 0, 0, 0, 0),
        "open_by_handle_at": (304, -100, "BUF", 0),
        "syslog-read-all": (103, 3, "BUF", 4096),
    },
}


def _run_attempts(target, attempts: dict[str, tuple]) -> dict[str, str]:
    lines = [f"print({name!r}, attempt({', '.join(str(arg) for arg in call)}))" for name, call in attempts.items()]
    result = target.run_sync(ATTEMPT + "\n".join(lines))
    assert result.ok, result.text
    return dict(line.split() for line in result.text.splitlines())


@pytest.fixture(scope="module")
def target(attack_sandbox):
    return attack_sandbox


@pytest.mark.parametrize("attack_class", sorted(REFUSED))
def test_the_filter_refuses_the_attack_class(target, healthy, attack_class):
    outcomes = _run_attempts(target, REFUSED[attack_class])
    assert outcomes == {name: "EPERM" for name in REFUSED[attack_class]}
    healthy(target)


def test_clone3_is_refused_so_that_flags_it_hides_cannot_pass(target, healthy):
    # A classic filter cannot read clone3's flags: ENOSYS makes the C library fall back to clone, which it checks.
    assert _run_attempts(target, {"clone3": (435, "BUF", 88)}) == {"clone3": "ENOSYS"}
    healthy(target)


def test_x32_system_calls_are_refused(target, healthy):
    # x32 numbers (bit 30 set) reach the same kernel functions under numbers the filter would not recognise.
    attempts = {"x32-getpid": (0x40000000 | 39,), "x32-unshare-user": (0x40000000 | 272, CLONE_NEWUSER)}
    assert _run_attempts(target, attempts) == {"x32-getpid": "EPERM", "x32-unshare-user": "EPERM"}
    healthy(target)


# i386 system calls through ``int 0x80`` from 64-bit code: push rbx; mov eax, NR; mov ebx, ARG; int 0x80; pop rbx; ret
INT80 = (
    "import ctypes, mmap, os, struct\n"
    "def int80(number, argument):\n"
    "    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "    page.write(b'\\x53\\xb8' + struct.pack('<I', number) + b'\\xbb' + struct.pack('<I', argument)"
    " + b'\\xcd\\x80\\x5b\\xc3')\n"
    "    address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
    "    read, write = os.pipe()\n"
    "    if os.fork() == 0:\n"  # a kernel without 32-bit emulation answers int 0x80 with SIGSEGV
    "        os.write(write, str(ctypes.CFUNCTYPE(ctypes.c_int)(address)()).encode())\n"
    "        os._exit(0)\n"
    "    os.close(write)\n"
    "    _, status = os.wait()\n"
    "    return os.read(read, 64).decode() or f'crashed {os.waitstatus_to_exitcode(status)}'\n"
    "print('getpid', int80(20, 0))\n"
    "print('unshare-user', int80(310, 0x10000000))\n"
)


def test_32_bit_system_calls_are_refused(target, healthy):
    # The red team's way in: int 0x80 passed the old filter and unshare(CLONE_NEWUSER) made the code root.
    result = target.run_sync(INT80)
    assert result.ok, result.text
    outcomes = dict(line.split(" ", 1) for line in result.text.splitlines())
    for name, outcome in outcomes.items():
        assert outcome in ("-1", "crashed -11"), (name, outcome)  # -EPERM from the filter, or no such ABI
    healthy(target)


@pytest.mark.parametrize(
    ("family", "name"),
    [(1, "unix"), (16, "netlink"), (17, "packet"), (38, "crypto"), (40, "vsock"), (4, "ipx")],
)
def test_sockets_other_than_ip_are_refused(target, healthy, family, name):
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.socket({family}, socket.SOCK_DGRAM if {family} != 38 else socket.SOCK_SEQPACKET)\n"
        "    print('opened')\n"
        "except OSError as error:\n"
        "    print(error.errno)"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "97\n", (name, result.text)  # EAFNOSUPPORT
    healthy(target)


def test_rlimits_cannot_be_raised(target, healthy):
    code = (
        "import resource\nraised = []\n"
        "for name in ('RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE'):\n"
        "    which = getattr(resource, name)\n"
        "    soft, hard = resource.getrlimit(which)\n"
        "    try:\n"
        "        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        raised.append(name)\n"
        "    except (ValueError, OSError):\n"
        "        pass\n"
        "print(raised)"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "[]\n", result.text
    healthy(target)


def test_realtime_scheduling_is_refused(target, healthy):
    # A real-time spinner would starve the host's own processes: RLIMIT_RTPRIO is 0 and no CAP_SYS_NICE is left.
    code = (
        "import os\nrefused = []\n"
        "for policy in (os.SCHED_FIFO, os.SCHED_RR):\n"
        "    try:\n"
        "        os.sched_setscheduler(0, policy, os.sched_param(1))\n"
        "    except PermissionError:\n"
        "        refused.append(policy)\n"
        "try:\n"
        "    os.setpriority(os.PRIO_PROCESS, 0, -10)\n"
        "except PermissionError:\n"
        "    refused.append('nice')\n"
        "print(len(refused))"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "3\n", result.text
    healthy(target)


def test_no_privilege_can_be_regained(target, healthy):
    # no_new_privs: set-uid binaries and file capabilities grant nothing; no capability is left to the code.
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print('no_new_privs', status['NoNewPrivs'].strip(), 'seccomp', status['Seccomp'].strip())\n"
        "print('effective', status['CapEff'].strip(), 'permitted', status['CapPrm'].strip())\n"
        "print('ambient-raise', libc.prctl(47, 2, 21, 0, 0))\n"  # PR_CAP_AMBIENT_RAISE CAP_SYS_ADMIN
        "print('uid', os.getuid() != 0, os.geteuid() != 0 or os.getuid() == os.geteuid())"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    lines = result.text.splitlines()
    assert lines[0] == "no_new_privs 1 seccomp 2"
    assert lines[1] == "effective 0000000000000000 permitted 0000000000000000"
    assert lines[2] == "ambient-raise -1"
    if os.geteuid() == 0:
        assert lines[3] == "uid True True"  # root on the host, never root in the sandbox
    healthy(target)


def test_ordinary_code_still_works_under_the_filter(target, healthy):
    # What the filter must not break: processes, threads, pipes, socketpairs, loopback IP, named semaphores.
    code = (
        "import asyncio, multiprocessing, socket, subprocess, threading, concurrent.futures as futures\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    squares = pool.map(abs, [-1, -2, -3])\n"
        "lock = multiprocessing.get_context('fork').Lock()\n"  # a POSIX semaphore in /dev/shm
        "with futures.ThreadPoolExecutor(2) as executor:\n"
        "    doubled = list(executor.map(lambda v: 2 * v, range(3)))\n"
        "left, right = socket.socketpair()\nleft.sendall(b'ping')\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "client = socket.create_connection(server.getsockname())\n"
        "echo = subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout.strip()\n"
        "print(squares, doubled, right.recv(4), client.fileno() > 0, echo, asyncio.run(asyncio.sleep(0, 'loop')))"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    assert result.text == "[1, 2, 3] [0, 2, 4] b'ping' True hi loop\n"
    healthy(target)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_compiles_for_each_known_machine(machine):
    program = sandbox_filter(machine)
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF's program limit


def test_no_filter_is_claimed_for_an_unknown_machine():
    assert sandbox_filter("mips64") is None
