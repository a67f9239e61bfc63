"""Python code execution for the ``<python>`` tool: one interface, several backends.

`SandboxConfig` chooses and tunes a backend; `make_executor` builds it; `PythonSandbox` is
the user-facing object (``await sandbox.run(code)`` or ``sandbox.run_sync(code)``).
Backends have ``async run(code) -> ToolResult`` and ``async aclose()``:

- ``local`` (default): pooled warm workers isolated with bubblewrap (`local_backend`);
- ``docker``: pooled warm workers in locked-down containers (`docker_backend`);
- ``subprocess``: a fresh ``python`` per call, no isolation (`subprocess_backend`).

Example:
    >>> from rapo_tools.sandbox import SandboxConfig, make_executor
    >>> executor = make_executor(SandboxConfig(backend="subprocess"))
    >>> type(executor).__name__
    'SubprocessExecutor'
"""

from __future__ import annotations

from rapo_tools.sandbox.config import SandboxConfig
from rapo_tools.sandbox.pool import SandboxUnavailableError
from rapo_tools.sandbox.python_sandbox import PythonSandbox, make_executor

__all__ = ["PythonSandbox", "SandboxConfig", "SandboxUnavailableError", "make_executor"]
