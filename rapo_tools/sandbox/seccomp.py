"""The seccomp filter of the local sandbox: the native system-call ABI only, minus the kernel's attack surface.

The worker installs it (`rapo_tools.sandbox.worker`) before it drops privileges, so every call's code runs
under it. It refuses, with EPERM unless said otherwise:

- every other ABI: another architecture (32-bit ``int 0x80`` on x86_64, arm32 on aarch64) and x32
  system calls, whose numbers would dodge the checks below;
- new namespaces: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, and ``clone3`` with
  ENOSYS (a classic filter cannot read its flags; the C library then falls back to ``clone``). In a
  user namespace of its own, code would be root there and could mount unbounded tmpfs or reach netfilter;
- mounting of any kind (``mount`` and the new mount API), ``pivot_root``, ``chroot``;
- state that outlives a call: SysV IPC (shared memory, semaphores, message queues), POSIX message
  queues and kernel keyrings (``add_key``, ``keyctl``: a uid's keyring survives its processes' calls);
- memory that no rlimit counts: ``memfd_create``, ``memfd_secret``;
- the usual exploit primitives: io_uring (its operations bypass this filter), ``userfaultfd``, ``bpf``,
  ``perf_event_open``, ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, ``pidfd_getfd``, module
  loading, kexec, ``open_by_handle_at`` (a classic container escape), ``syslog`` (the host's kernel log),
  ``personality`` other than the default or a query;
- changing another process's limits or scheduling: ``prlimit64``, ``sched_setscheduler``, ``sched_setparam``,
  ``sched_setattr`` and ``sched_setaffinity`` on any pid but 0 (the caller), ``setpriority`` and ``ioprio_set``
  on anything but the caller itself. The code's parent is the worker's template, whose limits and scheduling
  every later call inherits: lowering its hard limits once would break every later call on it;
- sockets other than IPv4/IPv6 (EAFNOSUPPORT): no unix sockets, so no host socket is reachable through
  the read-only filesystem, and no netlink, packet, vsock (which crosses a VM's boundary) or crypto sockets.
  ``socketpair`` stays allowed for stream and seqpacket pairs, which reach nothing outside the call; a
  datagram pair (or SOCK_RAW, which unix sockets turn into datagrams) gets ESOCKTNOSUPPORT: ``sendto``
  on it reaches any datagram socket on the host's filesystem (``/dev/log``, a journal).

Example:
    >>> program = sandbox_filter()
    >>> program is None or len(program) % 8 == 0  # whole sock_filter instructions
    True
"""

from __future__ import annotations

import errno
import platform
import struct

# Flags of clone(2) that make a namespace: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_SYSCALL_BIT = 0x40000000
_AF_INET, _AF_INET6 = 2, 10
_SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 5, 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
_PERSONALITY_ALLOWED = (0, 0xFFFFFFFF)  # PER_LINUX, and the query that changes nothing
SELF_ONLY = ("prlimit64", "sched_setscheduler", "sched_setparam", "sched_setattr", "sched_setaffinity")
"""Calls allowed only with pid 0 (the caller) as their first argument."""
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1  # setpriority's and ioprio_set's "which": one process (then 0 is us)

# The refused system calls by name; each table maps them to its architecture's numbers.
DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
    "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "add_key", "request_key", "keyctl",
    "memfd_create", "memfd_secret",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "bpf", "perf_event_open",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "open_by_handle_at", "syslog",
)

_X86_64 = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442,
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
    "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241,
    "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
    "add_key": 248, "request_key": 249, "keyctl": 250, "memfd_create": 319, "memfd_secret": 447,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323, "bpf": 321,
    "perf_event_open": 298, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
    "kexec_file_load": 320, "open_by_handle_at": 304, "syslog": 103,
    "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53, "personality": 135,
    "prlimit64": 302, "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314,
    "sched_setaffinity": 203, "setpriority": 141, "ioprio_set": 251,
}

_AARCH64 = {
    "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442,
    "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
    "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
    "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
    "add_key": 217, "request_key": 218, "keyctl": 219, "memfd_create": 279, "memfd_secret": 447,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "bpf": 280,
    "perf_event_open": 241, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "pidfd_getfd": 438, "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
    "kexec_file_load": 294, "open_by_handle_at": 265, "syslog": 116,
    "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199, "personality": 92,
    "prlimit64": 261, "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274,
    "sched_setaffinity": 122, "setpriority": 140, "ioprio_set": 30,
}

# machine -> (AUDIT_ARCH_*, numbers, every call below this number is allowed at once: the hot path)
_ARCHITECTURES = {
    "x86_64": (0xC000003E, _X86_64, 29),  # read .. madvise
    "aarch64": (0xC00000B7, _AARCH64, 0),
}

# Classic BPF opcodes (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_AND_K = 0x54
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

# Offsets in struct seccomp_data (the low word of the first argument: both ABIs are little-endian).
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW = 0, 4, 16, 24


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


class _Assembler:
    """Straight-line BPF with forward jumps to named labels (offsets are resolved at the end)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, int, str | None, str | None]] = []
        self.labels: dict[str, int] = {}

    def emit(self, code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self.lines.append((code, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.lines)

    def assemble(self) -> bytes:
        def offset(index: int, target: str | None) -> int:
            if target is None:
                return 0
            distance = self.labels[target] - index - 1
            if not 0 <= distance < 256:
                raise ValueError(f"jump to {target} out of range ({distance})")
            return distance

        return b"".join(_op(code, k, offset(i, jt), offset(i, jf)) for i, (code, k, jt, jf) in enumerate(self.lines))


def sandbox_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one), or None where it is not known."""
    known = _ARCHITECTURES.get(machine or platform.machine())
    if known is None:
        return None
    arch, numbers, hot_below = known
    asm = _Assembler()
    asm.emit(_LD_W_ABS, _ARCH)
    asm.emit(_JEQ_K, arch, None, "deny")  # another ABI: refused outright
    asm.emit(_LD_W_ABS, _NR)
    if arch == 0xC000003E:
        asm.emit(_JGE_K, _X32_SYSCALL_BIT, "deny")  # x32 numbers would dodge every check below
    if hot_below:
        asm.emit(_JGE_K, hot_below, None, "allow")
    for name in DENIED:
        asm.emit(_JEQ_K, numbers[name], "deny")
    asm.emit(_JEQ_K, numbers["clone3"], "nosys")
    asm.emit(_JEQ_K, numbers["clone"], "clone")
    asm.emit(_JEQ_K, numbers["socket"], "socket")
    asm.emit(_JEQ_K, numbers["socketpair"], "socketpair")
    for name in SELF_ONLY:
        asm.emit(_JEQ_K, numbers[name], "self_only")
    asm.emit(_JEQ_K, numbers["setpriority"], "setpriority")
    asm.emit(_JEQ_K, numbers["ioprio_set"], "ioprio_set")
    asm.emit(_JEQ_K, numbers["personality"], "personality", "allow")
    asm.label("self_only")  # pid_t is 32 bits: the kernel reads only the low word
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JEQ_K, 0, "allow", "deny")
    asm.label("setpriority")
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JEQ_K, _PRIO_PROCESS, "who_is_self", "deny")
    asm.label("ioprio_set")
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JEQ_K, _IOPRIO_WHO_PROCESS, "who_is_self", "deny")
    asm.label("who_is_self")
    asm.emit(_LD_W_ABS, _ARG1_LOW)
    asm.emit(_JEQ_K, 0, "allow", "deny")
    asm.label("clone")
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JSET_K, CLONE_NEW_FLAGS, "deny", "allow")
    asm.label("socket")
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JEQ_K, _AF_INET, "allow")
    asm.emit(_JEQ_K, _AF_INET6, "allow", "no_family")
    asm.label("socketpair")
    asm.emit(_LD_W_ABS, _ARG1_LOW)
    asm.emit(_AND_K, _SOCK_TYPE_MASK)
    asm.emit(_JEQ_K, _SOCK_STREAM, "allow")
    asm.emit(_JEQ_K, _SOCK_SEQPACKET, "allow", "no_type")
    asm.label("personality")
    asm.emit(_LD_W_ABS, _ARG0_LOW)
    asm.emit(_JEQ_K, _PERSONALITY_ALLOWED[0], "allow")
    asm.emit(_JEQ_K, _PERSONALITY_ALLOWED[1], "allow", "deny")
    asm.label("allow")
    asm.emit(_RET_K, _ALLOW)
    asm.label("deny")
    asm.emit(_RET_K, _ERRNO | errno.EPERM)
    asm.label("nosys")
    asm.emit(_RET_K, _ERRNO | errno.ENOSYS)
    asm.label("no_family")
    asm.emit(_RET_K, _ERRNO | errno.EAFNOSUPPORT)
    asm.label("no_type")
    asm.emit(_RET_K, _ERRNO | errno.ESOCKTNOSUPPORT)
    return asm.assemble()
