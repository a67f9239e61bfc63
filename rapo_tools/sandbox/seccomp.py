"""A tiny seccomp filter for the local sandbox: no new user namespaces.

Inside a user namespace of its own, sandboxed code would own new mount namespaces and
could mount tmpfs filesystems that no rlimit bounds (a memory bomb that bypasses the
address-space limit). The filter makes ``unshare`` fail with EPERM, ``clone`` with
CLONE_NEWUSER fail with EPERM, and ``clone3`` (whose flags a classic BPF filter cannot
read) fail with ENOSYS, so that the C library falls back to ``clone``. Everything else
is allowed. bubblewrap installs it (``--seccomp FD``) just before starting the worker.

Example:
    >>> program = user_namespace_filter()
    >>> program is None or len(program) % 8 == 0  # whole sock_filter instructions
    True
"""

from __future__ import annotations

import errno
import os
import platform
import struct

_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, unshare, clone, clone3)
_SYSCALLS = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}

# Classic BPF opcodes (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

# Offsets in struct seccomp_data.
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def user_namespace_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one), or None where it is not known."""
    numbers = _SYSCALLS.get(machine or platform.machine())
    if numbers is None:
        return None
    arch, unshare, clone, clone3 = numbers
    deny = _ERRNO | errno.EPERM
    program = [
        _op(_LD_W_ABS, _ARCH),
        _op(_JEQ_K, arch, 1, 0),
        _op(_RET_K, _ALLOW),  # another ABI: not ours to judge
        _op(_LD_W_ABS, _NR),
        _op(_JGE_K, _X32_SYSCALL_BIT, 0, 1) if arch == 0xC000003E else _op(_JEQ_K, 0xFFFFFFFF, 0, 1),
        _op(_RET_K, deny),  # x32 system calls would dodge the numbers below
        _op(_JEQ_K, unshare, 0, 1),
        _op(_RET_K, deny),
        _op(_JEQ_K, clone3, 0, 1),
        _op(_RET_K, _ERRNO | errno.ENOSYS),
        _op(_JEQ_K, clone, 0, 3),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JSET_K, _CLONE_NEWUSER, 0, 1),
        _op(_RET_K, deny),
        _op(_RET_K, _ALLOW),
    ]
    return b"".join(program)


def readable_fd(data: bytes) -> int:
    """A pipe's read end holding ``data`` (for bwrap's ``--seccomp FD``); the caller closes it."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end
