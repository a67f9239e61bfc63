"""The plain backend: one fresh ``python`` process per call, with a timeout and an output cap.

No isolation. It is the reference implementation's way of running code (``python -c``
per call) and stays for comparison and for reference-fidelity runs.

Example:
    >>> from rapo_tools.aio import run_sync
    >>> result = run_sync(SubprocessExecutor(timeout_s=10).run("sum(range(10))"))
    >>> result.text.strip(), result.ok
    ('45', True)
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable

from rapo_tools.base import ToolResult
from rapo_tools.sandbox.repl import RUNNER_SOURCE, format_execution_output, timeout_message


async def read_capped(
    stream: asyncio.StreamReader, max_bytes: int, on_overflow: Callable[[], None]
) -> tuple[bytes, bool]:
    """Read ``stream`` to EOF, keeping at most ``max_bytes``; call ``on_overflow`` once more arrives.

    Returns the bytes kept and whether the stream overflowed.
    """
    kept = bytearray()
    while chunk := await stream.read(65536):
        room = max_bytes - len(kept)
        if len(chunk) > room:
            kept += chunk[:room]
            on_overflow()  # stop the writer, or the other pipe may never reach EOF
            return bytes(kept), True
        kept += chunk
    return bytes(kept), False


def kill_process_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid``; a group that is already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class SubprocessExecutor:
    """Runs each snippet in a new interpreter process (its own session, killed as a group)."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        max_output_bytes: int = 64_000,
        python: str = sys.executable,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.python = python

    async def run(self, code: str) -> ToolResult:
        """Execute ``code`` with REPL semantics; never raises for anything the code does."""
        process = await asyncio.create_subprocess_exec(
            self.python, "-I", "-c", RUNNER_SOURCE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            (stdout, out_cut), (stderr, err_cut), exit_code = await asyncio.wait_for(
                self._communicate(process, code.encode("utf-8", "replace")), self.timeout_s
            )
        except asyncio.TimeoutError:
            kill_process_group(process.pid)
            await process.wait()
            return ToolResult(
                text=timeout_message(self.timeout_s),
                ok=False, timed_out=True, error="timeout",
            )
        finally:
            kill_process_group(process.pid)  # nothing the code started may outlive the call
        text, ok = format_execution_output(
            stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), exit_code
        )
        return ToolResult(text=text, ok=ok, truncated=out_cut or err_cut, error=None if ok else "execution_error")

    async def _communicate(self, process: asyncio.subprocess.Process, code: bytes):
        assert process.stdin and process.stdout and process.stderr  # created with PIPE above
        process.stdin.write(code)
        try:
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        process.stdin.close()
        stop = functools.partial(kill_process_group, process.pid)
        out, err = await asyncio.gather(
            read_capped(process.stdout, self.max_output_bytes, stop),
            read_capped(process.stderr, self.max_output_bytes, stop),
        )
        exit_code = await process.wait()
        if (out[1] or err[1]) and exit_code == -signal.SIGKILL:
            # Killed by us for flooding: a clean stderr means the code itself had not failed.
            exit_code = 1 if err[0] else 0
        return out, err, exit_code

    async def aclose(self) -> None:
        """Nothing to release: every call owns its process."""
