"""The ``<python>`` tool: runs model-written code in the configured sandbox backend (default: ``local``).

Example:
    >>> tool = PythonTool(sandbox="subprocess")
    >>> tool.call("x = 12\\nx * 3").text.strip()
    '36'
    >>> tool.close()
"""

from __future__ import annotations

from typing import Any

from rapo_tools.aio import run_sync
from rapo_tools.base import BadToolInputError, Tool, ToolResult
from rapo_tools.sandbox import SandboxConfig, make_executor


class PythonTool(Tool):
    """Executes the argument as Python with REPL semantics (a final bare expression is printed)."""

    name = "python"

    def __init__(self, sandbox: SandboxConfig | dict[str, Any] | str | None = None, max_code_chars: int = 20_000):
        self.config = SandboxConfig.from_value(sandbox)
        self.max_code_chars = max_code_chars
        self._executor = make_executor(self.config)

    async def _execute(self, argument: str) -> ToolResult:
        code = argument.strip("\n")
        if not code.strip():
            raise BadToolInputError("the <python> block is empty; put code between <python> and </python>")
        if len(code) > self.max_code_chars:
            raise BadToolInputError(f"the code is {len(code)} characters long; the limit is {self.max_code_chars}")
        return await self._executor.run(code)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            run_sync(executor.aclose())
