"""`PythonSandbox`: run code in the configured backend, from async or sync code.

Example:
    >>> sandbox = PythonSandbox({"backend": "local", "pool_size": 1, "preload_modules": ["math"]})
    >>> sandbox.run_sync("import math\\nmath.gcd(12, 18)").text
    '6\\n'
    >>> sandbox.close()
"""

from __future__ import annotations

from typing import Any

from rapo_tools.aio import on_portal, run_sync
from rapo_tools.base import ToolResult
from rapo_tools.sandbox.config import SandboxConfig


def make_executor(config: SandboxConfig):
    """Build the backend that ``config.backend`` names (local, docker or subprocess)."""
    if config.backend == "local":
        from rapo_tools.sandbox.local_backend import LocalSandboxExecutor

        return LocalSandboxExecutor(config)
    if config.backend == "docker":
        from rapo_tools.sandbox.docker_backend import DockerExecutor

        return DockerExecutor(config)
    from rapo_tools.sandbox.subprocess_backend import SubprocessExecutor

    python = {"python": config.python} if config.python else {}
    return SubprocessExecutor(timeout_s=config.timeout_s, max_output_bytes=config.max_output_bytes,
                              max_code_bytes=config.max_code_bytes, output=config.output, memory_mb=config.memory_mb,
                              **python)


class PythonSandbox:
    """Executes Python with REPL semantics in an isolated, pooled backend.

    Args:
        config: A `SandboxConfig`, a dict of its fields (YAML), a backend name, or None for the defaults.

    Raises:
        SandboxUnavailableError: when the backend's isolation is not available (see ``allow_unsandboxed``).
    """

    def __init__(self, config: SandboxConfig | dict[str, Any] | str | None = None) -> None:
        self.config = SandboxConfig.from_value(config)
        self._executor = make_executor(self.config)

    async def run(self, code: str) -> ToolResult:
        """Execute ``code``; safe to await from any event loop and concurrently."""
        if self._executor is None:
            raise RuntimeError("this PythonSandbox is closed")
        return await on_portal(self._executor.run(code))

    def run_sync(self, code: str) -> ToolResult:
        """Synchronous facade of `run`."""
        return run_sync(self.run(code))

    def close(self) -> None:
        """Release the backend (the shared pool stops when its last user closes)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            run_sync(executor.aclose())

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
