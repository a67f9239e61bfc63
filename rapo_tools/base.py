"""The one interface every tool shares: a call (name, argument text) gives a `ToolResult`.

Tools are async first, so that many episodes' calls run concurrently; `Tool.call`
is the synchronous facade. Subclasses implement `Tool._execute` only; the base
class measures latency, caps the result text and turns unexpected exceptions into
failed results, so that a broken tool never crashes an episode.

Example:
    >>> from rapo_tools.base import Tool, ToolResult
    >>> class Echo(Tool):
    ...     name = "echo"
    ...     async def _execute(self, argument):
    ...         return ToolResult(text=argument.upper(), ok=True)
    >>> Echo().call("hi").text
    'HI'
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import ClassVar

from rapo_tools.aio import on_portal, run_sync

EMPTY_CALL = "empty_call"
"""``ToolResult.error`` of an empty call by a reference-mode tool: the episode ends there, as in the reference."""


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call returns."""

    text: str
    """The text shown to the model (inside ``<result>`` tags by the environment)."""
    ok: bool
    """False when the call failed: an error, a timeout, a dead service, bad arguments."""
    latency_s: float = 0.0
    """Wall-clock seconds the call took, measured by `Tool`."""
    truncated: bool = False
    """True when ``text`` was cut to the tool's output cap."""
    timed_out: bool = False
    """True when the call ran past its time limit."""
    error: str | None = None
    """A short machine-readable error kind (``"timeout"``, ``"service_unavailable"``, ...) when not ok."""


class ToolError(Exception):
    """Base class of the typed errors that tool clients raise (and tools turn into failed results)."""

    kind: ClassVar[str] = "tool_error"


class ToolTimeoutError(ToolError):
    """The tool or the service behind it did not answer in time."""

    kind = "timeout"


class ServiceUnavailableError(ToolError):
    """The service behind the tool could not be reached or kept failing after retries."""

    kind = "service_unavailable"


class BadToolInputError(ToolError):
    """The argument text cannot be used (empty, too long, malformed)."""

    kind = "bad_input"


def truncate_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut ``text`` to ``max_chars`` characters, marking the cut. Returns the text and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n... [truncated {len(text) - max_chars} characters]"
    return text[: max(0, max_chars - len(marker))] + marker, True


class Tool(abc.ABC):
    """Base class of all tools.

    Attributes:
        name: The tag the model uses to call the tool, e.g. ``"python"`` for ``<python>...</python>``.
        max_result_chars: Results longer than this are cut (with a marker) before the model sees them.
    """

    name: ClassVar[str]
    max_result_chars: int = 8_000

    @property
    def reference_output(self) -> bool:
        """Whether the tool renders its output as the reference's does (its ``output="reference"`` mode): the env
        then leaves result tags the tool printed as they are, as the reference does (docs/fidelity.md, D4).
        False unless a tool with such a mode says so."""
        return False

    @abc.abstractmethod
    async def _execute(self, argument: str) -> ToolResult:
        """Run the call. Raise a `ToolError` for expected failures; the base class reports them."""

    async def acall(self, argument: str) -> ToolResult:
        """Run one call; safe to await from any event loop and concurrently."""
        return await on_portal(self._timed(argument))

    def call(self, argument: str) -> ToolResult:
        """Synchronous facade of `acall`."""
        return run_sync(self._timed(argument))

    def close(self) -> None:  # noqa: B027  (a hook: most tools hold nothing)
        """Release the tool's resources (pools, clients). Calling it twice is harmless."""

    def __enter__(self) -> Tool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _timed(self, argument: str) -> ToolResult:
        start = time.perf_counter()
        try:
            result = await self._execute(argument)
        except ToolError as error:
            result = ToolResult(
                text=f"{self.name} failed: {error}",
                ok=False,
                timed_out=isinstance(error, ToolTimeoutError),
                error=error.kind,
            )
        except Exception as error:  # a tool bug must not end the episode
            result = ToolResult(
                text=f"{self.name} failed with an internal error: {type(error).__name__}: {error}",
                ok=False,
                error="internal",
            )
        text, cut = truncate_text(result.text, self.max_result_chars)
        return dataclasses.replace(
            result,
            text=text,
            truncated=result.truncated or cut,
            latency_s=time.perf_counter() - start,
        )
