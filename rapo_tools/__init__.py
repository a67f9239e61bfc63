"""Tools that rapo's agents call: a python sandbox, knowledge search, web search and browsing.

Every tool implements `rapo_tools.base.Tool`: ``await tool.acall(text)`` or ``tool.call(text)``
returns a `rapo_tools.base.ToolResult`.
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
