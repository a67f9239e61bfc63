"""REPL semantics shared by every sandbox backend: run code, print a final bare expression.

`REPL_FUNCTION_SOURCE` defines ``_rapo_run(source, namespace) -> exit status``; it is
plain source text so that it can run in any interpreter (a fresh ``python -c``, a warm
worker inside bubblewrap or a Docker container). `RUNNER_SOURCE` is a self-contained
program around it that reads the user's code from standard input. Tracebacks show only
the user's frames (``File "<code>"``), which is the useful tail the model needs.

Example:
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, "-c", RUNNER_SOURCE], input="x = 6\\nx * 7",
    ...                      capture_output=True, text=True).stdout
    >>> out
    '42\\n'
"""

from __future__ import annotations

import ast
import io
import signal
from typing import Literal

REPL_FUNCTION_SOURCE = r'''
import ast as _rapo_ast, sys as _rapo_sys, traceback as _rapo_traceback

def _rapo_run(source, namespace):
    try:
        tree = _rapo_ast.parse(source, "<code>", "exec")
    except SyntaxError:
        _rapo_traceback.print_exc(limit=0)
        return 1
    last = None
    if tree.body and isinstance(tree.body[-1], _rapo_ast.Expr):
        last = _rapo_ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, "<code>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<code>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=_rapo_sys.stderr)  # as the interpreter does for sys.exit("message")
        return 1
    except BaseException as error:
        frames = [f for f in _rapo_traceback.extract_tb(error.__traceback__) if f.filename == "<code>"]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += _rapo_traceback.format_list(frames)
        lines += _rapo_traceback.format_exception_only(type(error), error)
        _rapo_sys.stderr.write("".join(lines))
        return 1
    return 0
'''

RUNNER_SOURCE = REPL_FUNCTION_SOURCE + r'''
sys = _rapo_sys
sys.stdout.flush()
_status = _rapo_run(sys.stdin.read(), {"__name__": "__main__", "__builtins__": __builtins__})
sys.stdout.flush()
sys.stderr.flush()
sys.exit(_status)
'''

_SIGNAL_HINTS = {
    signal.SIGKILL: "it was killed (SIGKILL: a memory or process limit, or the code killed itself)",
    signal.SIGXCPU: "it used up its CPU time limit (SIGXCPU)",
    signal.SIGXFSZ: "it wrote a file larger than the file size limit (SIGXFSZ)",
    signal.SIGSEGV: "it crashed (SIGSEGV)",
}


def describe_exit(exit_code: int) -> str:
    """Explain an exit status the way a user understands it (negative means killed by a signal)."""
    if exit_code >= 0:
        return f"the process exited with status {exit_code}"
    number = -exit_code
    if number in _SIGNAL_HINTS:
        return f"the process stopped: {_SIGNAL_HINTS[number]}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"the process was killed by {name}"


OutputStyle = Literal["paper", "reference"]
"""How a call's output reads: ``paper`` (rapo's) or ``reference`` (the official RAPO tool's)."""


def format_execution_output(
    stdout: str, stderr: str, exit_code: int | None, style: OutputStyle = "paper"
) -> tuple[str, bool]:
    """Build the text the model sees: stdout on success, the error on failure.

    ``paper``: a hint when nothing was printed, and what was printed before a failure stays in front of
    its traceback (or of the reason the process stopped). ``reference``: exactly the official tool's
    ``stdout.strip()`` on success and ``stderr.strip()`` on failure, empty or not.

    Returns the text and whether the run succeeded.

    Example:
        >>> format_execution_output("1\\n", "Traceback ...\\nValueError: x\\n", 1, "reference")
        ('Traceback ...\\nValueError: x', False)
    """
    if style == "reference":
        return (stdout.strip(), True) if exit_code == 0 else (stderr.strip(), False)
    if exit_code == 0:
        return (stdout if stdout.strip() else "(no output; print() what you need to see)"), True
    detail = stderr.strip() or describe_exit(exit_code if exit_code is not None else -1)
    return (stdout + detail if stdout.strip() else detail), False


def print_last_expression(code: str) -> str:
    """The reference tool's REPL rule, applied to the source: a final bare expression becomes ``print(...)``.

    So it shows ``str(value)``, and ``None`` too (the sandbox's own REPL rule shows ``repr`` and skips
    ``None``). A final ``print(...)`` call and code that does not parse stay as they are. Only the last
    statement's text is wrapped, so line numbers in tracebacks stay the user's.

    Example:
        >>> print_last_expression("x = 'a'\\nx * 2")
        "x = 'a'\\nprint(x * 2)"
    """
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return code
    if not body or not isinstance(body[-1], ast.Expr):
        return code
    value = body[-1].value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    lines = io.StringIO(code, newline="").readlines()  # the lines ast counts (str.splitlines also splits at \f)

    def offset(line: int, column: int) -> int:  # ast columns count UTF-8 bytes
        return sum(len(text) for text in lines[: line - 1]) + len(lines[line - 1].encode()[:column].decode())

    start, end = offset(value.lineno, value.col_offset), offset(value.end_lineno, value.end_col_offset)
    shown = f"({code[start:end]})" if isinstance(value, ast.Tuple) else code[start:end]  # one value, as ast.unparse
    return f"{code[:start]}print({shown}){code[end:]}"


def timeout_message(timeout_s: float) -> str:
    """The text every backend returns when a call runs past its wall-clock limit."""
    return f"Execution timed out after {timeout_s:g} seconds."
