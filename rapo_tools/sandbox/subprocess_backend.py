"""The plain backend: one fresh ``python`` process per call, with a timeout and an output cap.

No isolation. It is the reference implementation's way of running code (``python -c``
per call) and stays for comparison and for reference-fidelity runs. Two things it does
hold: the code sees only an allow-list of the host's environment variables (no API keys),
and nothing the code starts outlives the call, not even a process in a session of its own:
the interpreter is a child subreaper (orphans become its children, whatever session they
are in) that runs the code in a fork and kills every descendant once the code is done, or
when the host ends the call (timeout, output cap) with SIGTERM.

Example:
    >>> from rapo_tools.aio import run_sync
    >>> result = run_sync(SubprocessExecutor(timeout_s=10).run("sum(range(10))"))
    >>> result.text.strip(), result.ok
    ('45', True)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import sys
from collections.abc import Callable

from rapo_tools.base import ToolResult
from rapo_tools.sandbox.pool import code_problem
from rapo_tools.sandbox.repl import REPL_FUNCTION_SOURCE, OutputStyle, format_execution_output, timeout_message
from rapo_tools.sandbox.worker import report_failure

PASSED_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "HOME", "USER", "LOGNAME", "TERM")
"""The only host environment variables the code sees."""

_END_GRACE_S = 2.0  # seconds the interpreter gets to kill the code's processes before its group is killed

# The interpreter of each call: a subreaper that runs the code in a fork, then kills what the code left.
SUPERVISED_RUNNER_SOURCE = REPL_FUNCTION_SOURCE + "\nimport os\n" + inspect.getsource(report_failure) + r'''
import ctypes as _ctypes, os as _os, signal as _signal

def _children():
    me, found = str(_os.getpid()).encode(), []
    for name in _os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                if name.isdigit() and handle.read().rsplit(b")", 1)[1].split()[1] == me:
                    found.append(int(name))
        except (OSError, IndexError):
            pass
    return found

def _kill_descendants():
    for _ in range(1000):  # each round kills one generation; orphans of the next come to us
        try:
            _os.waitpid(-1, _os.WNOHANG)  # reaps an exited child, if any
        except ChildProcessError:
            return  # no child at all: nothing the code started is left
        for pid in _children():
            try:
                _os.kill(pid, _signal.SIGKILL)
                _os.waitpid(pid, 0)
            except OSError:
                pass

def _end(signum, frame):
    _kill_descendants()
    _os._exit(128 + signum)

_ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
_signal.signal(_signal.SIGTERM, _end)
_code = _rapo_sys.stdin.read()
_pid = _os.fork()
if _pid == 0:
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    if len(_rapo_sys.argv) > 1:  # the address-space budget, on top of what the interpreter maps now
        import resource as _resource
        with open("/proc/self/statm", "rb") as _statm:
            _limit = int(_statm.read().split()[0]) * _resource.getpagesize() + int(_rapo_sys.argv[1])
        _resource.setrlimit(_resource.RLIMIT_AS, (_limit, _limit))
    try:
        _status = _rapo_run(_code, {"__name__": "__main__", "__builtins__": __builtins__})
    except BaseException as _error:  # RecursionError or MemoryError from the parser: say so
        report_failure("parse the code", _error)
        _status = 1
    _rapo_sys.stdout.flush()
    _rapo_sys.stderr.flush()
    _os._exit(_status)
_, _wait_status = _os.waitpid(_pid, 0)
_kill_descendants()
_exit_code = _os.waitstatus_to_exitcode(_wait_status)
if _exit_code < 0:  # killed by a signal: end the same way, so that the host says which
    if -_exit_code != _signal.SIGKILL:
        _signal.signal(-_exit_code, _signal.SIG_DFL)
    _os.kill(_os.getpid(), -_exit_code)
_os._exit(_exit_code)
'''


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
            while await stream.read(65536):
                pass  # read on to EOF: asyncio reports the exit only once every pipe is closed
            return bytes(kept), True
        kept += chunk
    return bytes(kept), False


def kill_process_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid``; a group that is already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_call(pid: int) -> None:
    """Ask the call's interpreter to kill everything the code started (it exits with `ENDED_STATUS`)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


ENDED_STATUS = 128 + signal.SIGTERM
"""Exit status of an interpreter that `end_call` ended."""


THREAD_LIMITS = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                         "NUMEXPR_NUM_THREADS")}
"""Set for the code, as in the local sandbox: a BLAS thread per core would reserve memory past ``memory_mb``."""


def passed_environment() -> dict[str, str]:
    """The part of the host's environment that the code sees (`PASSED_ENVIRONMENT`), plus `THREAD_LIMITS`."""
    return {**{name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ}, **THREAD_LIMITS}


class SubprocessExecutor:
    """Runs each snippet in a new interpreter process (its own session; nothing it starts outlives the call).

    ``memory_mb`` (None: no limit) caps the code's address space (RLIMIT_AS, per process) on top of what the
    interpreter maps when the code starts, as the ``local`` backend does; there is no cgroup to cap the code's
    processes together.
    """

    def __init__(
        self,
        timeout_s: float = 10.0,
        max_output_bytes: int = 64_000,
        python: str = sys.executable,
        max_code_bytes: int = 4 << 20,
        output: OutputStyle = "paper",
        memory_mb: int | None = None,
    ) -> None:
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.python = python
        self.max_code_bytes = max_code_bytes
        self.output = output

    async def run(self, code: str) -> ToolResult:
        """Execute ``code`` with REPL semantics; never raises for anything the code does."""
        problem = code_problem(code, self.max_code_bytes)
        if problem is not None:
            return problem
        budget = [] if self.memory_mb is None else [str(int(self.memory_mb) << 20)]
        process = await asyncio.create_subprocess_exec(
            self.python, "-I", "-c", SUPERVISED_RUNNER_SOURCE, *budget,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=passed_environment(),
        )
        try:
            (stdout, out_cut), (stderr, err_cut), exit_code = await asyncio.wait_for(
                self._communicate(process, code.encode("utf-8", "replace")), self.timeout_s
            )
        except asyncio.TimeoutError:
            await self._end(process)
            return ToolResult(
                text=timeout_message(self.timeout_s),
                ok=False, timed_out=True, error="timeout",
            )
        finally:
            kill_process_group(process.pid)  # the interpreter itself, should it still run
        text, ok = format_execution_output(
            stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), exit_code, self.output
        )
        return ToolResult(text=text, ok=ok, truncated=out_cut or err_cut, error=None if ok else "execution_error")

    @staticmethod
    async def _end(process: asyncio.subprocess.Process) -> None:
        """End a call that is still running: its interpreter kills the code's processes, then itself."""
        end_call(process.pid)
        try:
            await asyncio.wait_for(process.wait(), _END_GRACE_S)
        except asyncio.TimeoutError:
            kill_process_group(process.pid)
            await process.wait()

    async def _communicate(self, process: asyncio.subprocess.Process, code: bytes):
        assert process.stdin and process.stdout and process.stderr  # created with PIPE above
        process.stdin.write(code)
        try:
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        process.stdin.close()
        stop = functools.partial(end_call, process.pid)
        out, err = await asyncio.gather(
            read_capped(process.stdout, self.max_output_bytes, stop),
            read_capped(process.stderr, self.max_output_bytes, stop),
        )
        exit_code = await process.wait()
        if (out[1] or err[1]) and exit_code in (ENDED_STATUS, -signal.SIGKILL):
            # Ended by us for flooding: a clean stderr means the code itself had not failed.
            exit_code = 1 if err[0] else 0
        return out, err, exit_code

    async def aclose(self) -> None:
        """Nothing to release: every call owns its process."""
