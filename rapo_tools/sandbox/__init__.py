"""Python code execution for the ``<python>`` tool.

`SandboxConfig` chooses and tunes a backend; `make_executor` builds it. Every backend
has ``async run(code) -> ToolResult`` and ``async aclose()``.

Example:
    >>> from rapo_tools.sandbox import SandboxConfig, make_executor
    >>> executor = make_executor(SandboxConfig(backend="subprocess"))
    >>> type(executor).__name__
    'SubprocessExecutor'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass
class SandboxConfig:
    """Settings of the python sandbox (reachable from ``gym.make(..., sandbox=...)`` and YAML)."""

    backend: Literal["subprocess"] = "subprocess"
    """Which backend runs the code: ``subprocess`` (a fresh ``python`` per call, no isolation)."""
    timeout_s: float = 10.0
    """Wall-clock seconds before the whole process tree of a call is killed."""
    max_output_bytes: int = 64_000
    """Bytes of stdout (and of stderr) kept per call; the rest is dropped and the result marked truncated."""

    @classmethod
    def from_value(cls, value: SandboxConfig | dict[str, Any] | str | None) -> SandboxConfig:
        """Accept a config, a dict of fields, a backend name, or None for the defaults."""
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


def make_executor(config: SandboxConfig):
    """Build the backend that ``config.backend`` names."""
    if config.backend == "subprocess":
        from rapo_tools.sandbox.subprocess_backend import SubprocessExecutor

        return SubprocessExecutor(timeout_s=config.timeout_s, max_output_bytes=config.max_output_bytes)
    raise ValueError(f"unknown sandbox backend {config.backend!r}; choose 'subprocess'")
