"""Small C loops for the CPU decoder, compiled on first use with the system's C compiler and loaded via ``ctypes``.

Each library is built once per source, flags and CPU (``-march=native``) into ``$RAPO_CACHE_DIR/native`` and
loaded from there afterwards. Where no compiler works, or ``RAPO_NATIVE=0``, `compiled_library` gives None and the
caller runs its torch ops instead (each caller says whether those give the same bits).

Example:
    >>> library = compiled_library("answer", "int answer(void) { return 42; }", ("-O2",), {"answer": ([], "int")})
    >>> library is None or library.answer() == 42  # None where no C compiler works
    True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

NATIVE_ENV_VAR = "RAPO_NATIVE"
"""Set to ``0`` to run the torch ops instead of the compiled loops."""

_CTYPES = {"pointer": ctypes.c_void_p, "int64": ctypes.c_int64, "float": ctypes.c_float, "int": ctypes.c_int,
           "void": None}


def _cpu_key() -> str:
    """What the compiled code depends on besides its source: the CPU (``-march=native``) and the platform."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            lines = [line for line in cpuinfo.read().splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "\n".join([platform.machine(), platform.system(), *lines])


def compiled_library(name: str, source: str, flags: Sequence[str],
                     signatures: Mapping[str, tuple[Sequence[str], str]]) -> ctypes.CDLL | None:
    """``source`` built with ``cc flags -shared -fPIC``, its functions typed by ``signatures``, or None.

    ``signatures`` maps each function to its argument types and return type, named as in ``_CTYPES``
    (``"pointer"``, ``"int64"``, ``"float"``, ``"int"``, ``"void"``). None where ``RAPO_NATIVE=0``, off Linux, or
    where the compiler fails.
    """
    if os.environ.get(NATIVE_ENV_VAR, "1") == "0" or platform.system() != "Linux":
        return None
    from rapo_tools.cache import rapo_cache_dir

    build = [*flags, "-shared", "-fPIC"]
    digest = hashlib.sha256("\n".join([source, *build, _cpu_key()]).encode()).hexdigest()[:16]
    target = rapo_cache_dir("native", f"{name}-{digest}.so")
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                source_file, built = Path(scratch, f"{name}.c"), Path(scratch, f"{name}.so")
                source_file.write_text(source)
                subprocess.run(["cc", *build, str(source_file), "-o", str(built), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: a second process building at once keeps either copy
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    for function, (arguments, result) in signatures.items():
        getattr(library, function).argtypes = [_CTYPES[argument] for argument in arguments]
        getattr(library, function).restype = _CTYPES[result]
    return library
