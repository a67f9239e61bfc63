"""Math rewards: answer equivalence through math-verify, under a hard time limit.

Example:
    >>> answers_equivalent("0.5", "\\\\frac{1}{2}")
    True
    >>> from rapo_env.tasks.base import Task
    >>> task = Task(id="t", question="?", answers=("12",), source="toy")
    >>> MathVerifyReward()("<answer>\\\\boxed{12}</answer>", task).reward
    1.0
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import select
import subprocess
import sys
import threading
from decimal import Decimal, InvalidOperation, localcontext

from rapo_env.protocol import TOOL_TAGS, check_format
from rapo_env.rewards import Score
from rapo_env.rewards.text import FORMAT_PENALTY, final_answer
from rapo_env.rewards.verify_worker import READY_LINE
from rapo_env.tasks.base import Task

_NUMBER_NOISE = str.maketrans("", "", "$ ")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_MAX_NUMBER_CHARS = 100
RELATIVE_TOLERANCE = Decimal("1e-9")
"""How far apart two numbers may be, relative to the larger, when either is not a whole number."""


def _as_number(text: str) -> Decimal | None:
    """The exact value of a plain number (``1,000``, ``$5``, ``3.``, ``50%``, ``1e-3``); None for anything else.

    A comma counts only as a thousands separator (``1,000``); ``1,2`` is not a number.
    """
    cleaned = text.strip().translate(_NUMBER_NOISE).rstrip(".")
    if cleaned.endswith("%"):
        cleaned = cleaned[:-1]
    if "," in cleaned:
        if not _THOUSANDS.fullmatch(cleaned):
            return None
        cleaned = cleaned.replace(",", "")
    if not cleaned or len(cleaned) > _MAX_NUMBER_CHARS or "_" in cleaned:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def numbers_equal(predicted: Decimal, expected: Decimal) -> bool:
    """Whether two numbers are the same answer: whole numbers exactly, others within `RELATIVE_TOLERANCE`.

    There is no absolute tolerance, so nothing but 0 equals a gold 0.

    Example:
        >>> numbers_equal(Decimal("1000000000999"), Decimal("1000000000000"))
        False
        >>> numbers_equal(Decimal("0.1"), Decimal("0.10000000000001")), numbers_equal(Decimal("1e-10"), Decimal(0))
        (True, False)
    """
    if predicted == expected:
        return True
    if predicted == predicted.to_integral_value() and expected == expected.to_integral_value():
        return False
    with localcontext() as context:
        context.prec = 40
        try:
            return abs(predicted - expected) <= RELATIVE_TOLERANCE * max(abs(predicted), abs(expected))
        except ArithmeticError:  # exponents past the context's range
            return False


STARTUP_TIMEOUT_S = 60.0
"""How long a fresh worker may take to import math-verify (sympy) before it says it is ready."""
KILL_MARGIN_S = 1.0
"""How long past its time limit a check may run before its worker is killed."""


class _VerifierProcess:
    """One math-verify child process, restarted when it hangs or dies. Used by one thread at a time.

    A fresh worker announces itself once its imports are done, so a check's time limit never
    includes the start-up: every check, on a warm worker or a new one, is cut off at
    ``timeout_s + KILL_MARGIN_S``.
    """

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def _ensure(self) -> subprocess.Popen[str] | None:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._process = subprocess.Popen(
            [sys.executable, "-m", "rapo_env.rewards.verify_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )
        if self._read_line(STARTUP_TIMEOUT_S) != READY_LINE:
            self.stop()
            return None
        return self._process

    def _read_line(self, timeout_s: float) -> str:
        process = self._process
        if process is None or process.stdout is None:
            return ""
        try:
            ready, _, _ = select.select([process.stdout], [], [], timeout_s)
            return process.stdout.readline() if ready else ""
        except (OSError, ValueError):
            return ""

    def equivalent(self, gold: str, prediction: str, timeout_s: float) -> bool:
        process = self._ensure()
        if process is None or process.stdin is None:
            return False
        try:
            process.stdin.write(json.dumps({"gold": gold, "prediction": prediction,
                                            "timeout": max(1, int(timeout_s))}) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.stop()
            return False
        line = self._read_line(timeout_s + KILL_MARGIN_S)
        if not line:
            self.stop()  # hung or crashed: the next call starts a fresh worker
            return False
        return bool(json.loads(line).get("equivalent", False))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


class _Borrower:
    """A caller waiting for a worker: `VerifierPool` hands workers to them in arrival order."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.worker: _VerifierProcess | None = None


def default_pool_size() -> int:
    """``RAPO_VERIFY_WORKERS`` when set, else up to 4 workers (one per core): each holds sympy (~100 MB)."""
    configured = os.environ.get("RAPO_VERIFY_WORKERS", "").strip()
    if configured:
        try:
            size = int(configured)
        except ValueError:
            raise ValueError(f"RAPO_VERIFY_WORKERS must be a whole number, got {configured!r}") from None
        if size < 1:
            raise ValueError(f"RAPO_VERIFY_WORKERS must be at least 1, got {size}")
        return size
    return max(1, min(4, os.cpu_count() or 1))


class VerifierPool:
    """``size`` killable math-verify children; each check borrows one, so ``size`` checks run at once.

    Every worker keeps the single-worker guarantee: a check that overruns its time limit kills that
    worker (it restarts on its next use, and its start-up is not charged to the check), so no
    expression can hold a worker longer than its limit. Callers are served in arrival order: a
    worker that comes back goes straight to the longest-waiting caller, so threads that keep sending
    slow expressions cannot starve another's check. Workers start on first need; the most recently
    used one is lent first, so light loads stay on warm workers whose math-verify caches already
    know the answer forms. Thread-safe; a forked child gets fresh workers.

    Example:
        >>> pool = VerifierPool(2)
        >>> pool.equivalent("\\\\frac{1}{2}", "0.5", timeout_s=5.0)
        True
        >>> pool.stop()
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a verifier pool needs at least one worker, got {size}")
        self.size = size
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # After a fork the parent's workers and lock belong to the parent: start over, kill nothing.
        self._lock = threading.Lock()
        self._all = [_VerifierProcess() for _ in range(self.size)]
        self._idle = list(self._all)  # a stack: the most recently returned worker is lent first
        self._waiting: collections.deque[_Borrower] = collections.deque()

    def _borrow(self) -> _VerifierProcess:
        with self._lock:
            if self._idle and not self._waiting:
                return self._idle.pop()
            borrower = _Borrower()
            self._waiting.append(borrower)
        borrower.ready.wait()
        if borrower.worker is None:  # _give_back sets the worker before it sets ready
            raise RuntimeError("a verifier pool woke a caller without a worker")
        return borrower.worker

    def _give_back(self, worker: _VerifierProcess) -> None:
        with self._lock:
            if self._waiting:  # straight to the longest-waiting caller: nobody jumps the queue
                borrower = self._waiting.popleft()
                borrower.worker = worker
                borrower.ready.set()
            else:
                self._idle.append(worker)

    def equivalent(self, gold: str, prediction: str, timeout_s: float) -> bool:
        """Whether math-verify finds ``prediction`` equal to ``gold``; False when it errs or overruns."""
        worker = self._borrow()
        try:
            return worker.equivalent(gold, prediction, timeout_s)
        finally:
            self._give_back(worker)

    def stop(self) -> None:
        """Kill every worker (they restart when used again)."""
        for worker in self._all:
            worker.stop()


_verifier = VerifierPool(default_pool_size())
atexit.register(_verifier.stop)


def answers_equivalent(prediction: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether two answers are mathematically equal (``0.5`` vs ``\\frac{1}{2}``), within ``timeout_s``.

    Identical strings (after stripping surrounding whitespace) and plain numbers (`numbers_equal`)
    are decided in-process; anything else goes to math-verify in one of a pool of child processes
    (`VerifierPool`, ``RAPO_VERIFY_WORKERS`` of them), and a child that overruns is killed, so a
    pathological expression cannot hang a step. No text normalisation is applied: a sign, a bracket
    or a decimal point is part of a math answer (``-3`` is not ``3``).
    """
    if not prediction.strip():
        return False
    if prediction.strip() == gold.strip():
        return True
    predicted, expected = _as_number(prediction), _as_number(gold)
    if predicted is not None and expected is not None:
        return numbers_equal(predicted, expected)
    if len(prediction) > 1000:
        return False
    return _verifier.equivalent(gold, prediction, timeout_s)


class MathVerifyReward:
    """The default math reward: 1 when the boxed answer equals a gold answer, 0 when not, and
    ``format_penalty`` when the response breaks the format rules of spec §2."""

    def __init__(self, tool_tags: tuple[str, ...] = TOOL_TAGS, format_penalty: float = FORMAT_PENALTY,
                 timeout_s: float = 5.0):
        self.tool_tags, self.format_penalty, self.timeout_s = tool_tags, format_penalty, timeout_s

    def __call__(self, response: str, task: Task) -> Score:
        check = check_format(response, self.tool_tags)
        if not check.ok:
            return Score(self.format_penalty, {"format_ok": 0.0, "accuracy": 0.0}, check.reason)
        prediction = final_answer(response) or ""
        correct = any(answers_equivalent(prediction, gold, self.timeout_s) for gold in task.answers)
        return Score(float(correct), {"format_ok": 1.0, "accuracy": float(correct)})
