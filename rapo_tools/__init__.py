"""Tools that rapo's agents call (the bottom layer): a python sandbox, knowledge search, web search and browsing.

Every tool implements `rapo_tools.base.Tool`: ``await tool.acall(text)`` or ``tool.call(text)``
returns a `rapo_tools.base.ToolResult`. Beside the tools it holds what their services share (HTTP
clients with retries, loopback serving, the bundled encoder models). It knows no env, buffer or policy.

Example:
    >>> from rapo_tools import ToolResult
    >>> ToolResult(text="42", ok=True).ok
    True
"""

from rapo_tools.base import (
    BadToolInputError,
    ServiceUnavailableError,
    Tool,
    ToolError,
    ToolResult,
    ToolTimeoutError,
)

__all__ = [
    "BadToolInputError",
    "ServiceUnavailableError",
    "Tool",
    "ToolError",
    "ToolResult",
    "ToolTimeoutError",
]
