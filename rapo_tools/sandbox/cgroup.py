"""A memory cgroup per local sandbox worker, where the kernel lets this process make one.

The address-space rlimit is per process and misses memory that no process maps (tmpfs files, kernel
objects such as inodes and socket buffers); a memory cgroup counts all of it, for every process of the
worker together. rapo makes one below its own cgroup (v1 ``memory`` hierarchy), or beside it (v2, where
a cgroup with processes cannot have children with controllers), and removes it with the worker.

Example:
    >>> group = MemoryCgroup.create()
    >>> group is None or group.usage_bytes() >= 0
    True
    >>> group is None or group.remove()
    True
"""

from __future__ import annotations

import itertools
import os

_V1_ROOT = "/sys/fs/cgroup/memory"
_V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
PREFIX = "rapo-sandbox-"
_names = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``"memory"`` (v1) and ``""`` (v2)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(","):
                    found.setdefault(name, path)
    except OSError:
        pass
    return found


def _parent_directory() -> tuple[str, int] | None:
    """Where worker cgroups go, and the cgroup version; None where this process may not make them."""
    own = _own_cgroups()
    if "memory" in own:
        base = _V1_ROOT + own["memory"].rstrip("/")
        if os.path.isfile(os.path.join(base, "memory.limit_in_bytes")) and os.access(base, os.W_OK):
            return base, 1
    if "" in own:
        for root in _V2_ROOTS:
            base = root + own[""].rstrip("/")
            try:
                with open(os.path.join(base, "cgroup.controllers")) as handle:
                    has_memory = "memory" in handle.read().split()
            except OSError:
                continue
            parent = os.path.dirname(base)
            if has_memory and os.access(parent, os.W_OK):
                return parent, 2
    return None


def _remove_stale(parent: str) -> None:
    """Remove the empty worker cgroups of rapo processes that died without removing theirs."""
    for name in os.listdir(parent):
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass  # still in use, or not ours to remove


class MemoryCgroup:
    """One worker's memory cgroup (``path``, cgroup ``version`` 1 or 2)."""

    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def create(cls) -> MemoryCgroup | None:
        """A fresh, unlimited cgroup; None where the kernel or the permissions do not allow one."""
        where = _parent_directory()
        if where is None:
            return None
        parent, version = where
        _remove_stale(parent)
        path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{next(_names)}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        return cls(path, version)

    @property
    def procs_file(self) -> str:
        """Writing a pid here moves that process (its children follow as they are forked)."""
        return os.path.join(self.path, "cgroup.procs")

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        with open(self.procs_file) as handle:
            return [int(line) for line in handle.read().split()]

    def _read(self, name: str) -> int:
        with open(os.path.join(self.path, name)) as handle:
            return int(handle.read().split()[0])

    def _write(self, name: str, value: int) -> None:
        with open(os.path.join(self.path, name), "w") as handle:
            handle.write(str(value))

    def usage_bytes(self) -> int:
        """Memory the cgroup's processes hold now (page cache, tmpfs and kernel memory included)."""
        return self._read("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    def limit(self, limit_bytes: int) -> None:
        """Cap the cgroup's memory, swap included: at the cap the kernel reclaims, then kills in the cgroup."""
        if self.version == 1:
            self._write("memory.limit_in_bytes", limit_bytes)
            if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                self._write("memory.memsw.limit_in_bytes", limit_bytes)  # no way around it through swap
        else:
            self._write("memory.max", limit_bytes)
            if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                self._write("memory.swap.max", 0)

    def limit_bytes(self) -> int:
        """The cap set now (a huge number while there is none)."""
        text_name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        with open(os.path.join(self.path, text_name)) as handle:
            text = handle.read().strip()
        return (1 << 63) if text == "max" else int(text)

    def remove(self) -> bool:
        """Remove the cgroup; False while processes are still leaving it."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True
