"""The ``<python>`` tool: runs model-written code in the configured sandbox backend (default: ``local``).

With ``sandbox={"output": "reference"}`` it behaves as the official RAPO tool and rollout loop do:
a final expression prints ``str(value)`` (``None`` too), a failure shows stderr alone, empty output
is retried up to `REFERENCE_ATTEMPTS` times and then reported as ``Tool(python) returned empty
output.``, and an empty ``<python></python>`` ends the episode (the result's ``error`` is
`EMPTY_CALL`, which the env turns into the episode's end).

Example:
    >>> tool = PythonTool(sandbox="subprocess")
    >>> tool.call("x = 12\\nx * 3").text.strip()
    '36'
    >>> tool.close()
    >>> reference = PythonTool(sandbox={"backend": "subprocess", "output": "reference"})
    >>> reference.call("'a' * 2").text, reference.call("None").text
    ('aa', 'None')
    >>> reference.close()
"""

from __future__ import annotations

from typing import Any

from rapo_tools.aio import run_sync
from rapo_tools.base import EMPTY_CALL, BadToolInputError, Tool, ToolResult
from rapo_tools.sandbox import SandboxConfig, make_executor
from rapo_tools.sandbox.repl import print_last_expression

REFERENCE_ATTEMPTS = 3
"""Runs of one call in reference mode while its output is empty (the reference's ``retry_count``)."""


class PythonTool(Tool):
    """Executes the argument as Python with REPL semantics (a final bare expression is printed)."""

    name = "python"

    def __init__(self, sandbox: SandboxConfig | dict[str, Any] | str | None = None, max_code_chars: int = 20_000):
        self.config = SandboxConfig.from_value(sandbox)
        self.max_code_chars = max_code_chars
        self._executor = make_executor(self.config)

    @property
    def reference_output(self) -> bool:
        return self.config.output == "reference"

    async def _execute(self, argument: str) -> ToolResult:
        reference = self.config.output == "reference"
        code = argument.strip() if reference else argument.strip("\n")
        if not code.strip():
            if reference:
                return ToolResult(text="", ok=False, error=EMPTY_CALL)
            raise BadToolInputError("the <python> block is empty; put code between <python> and </python>")
        if len(code) > self.max_code_chars:
            raise BadToolInputError(f"the code is {len(code)} characters long; the limit is {self.max_code_chars}")
        if not reference:
            return await self._executor.run(code)
        code = print_last_expression(code)
        for _ in range(REFERENCE_ATTEMPTS):
            result = await self._executor.run(code)
            if result.text:
                return result
        return ToolResult(text=f"Tool({self.name}) returned empty output.", ok=False, error="empty_output")

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            run_sync(executor.aclose())
