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
import json
import math
import os
import queue
import select
import subprocess
import sys

from rapo_env.protocol import TOOL_TAGS, check_format
from rapo_env.rewards import Score
from rapo_env.rewards.text import FORMAT_PENALTY, final_answer, normalize_answer
from rapo_env.tasks.base import Task

_NUMBER_NOISE = str.maketrans("", "", ",$ ")


def _as_number(text: str) -> float | None:
    cleaned = text.strip().translate(_NUMBER_NOISE).rstrip(".")
    if cleaned.endswith("%"):
        cleaned = cleaned[:-1]
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class _VerifierProcess:
    """One math-verify child process, restarted when it hangs or dies. Used by one thread at a time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def _ensure(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "rapo_env.rewards.verify_worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
            )
        return self._process

    def equivalent(self, gold: str, prediction: str, timeout_s: float) -> bool:
        # Generous first-call allowance: the worker imports sympy before its first answer.
        fresh = self._process is None or self._process.poll() is not None
        process = self._ensure()
        assert process.stdin is not None and process.stdout is not None  # opened with PIPE above
        try:
            process.stdin.write(json.dumps({"gold": gold, "prediction": prediction,
                                            "timeout": max(1, int(timeout_s))}) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], timeout_s + (30 if fresh else 1))
            line = process.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.stop()  # hung or crashed: the next call starts a fresh worker
            return False
        return bool(json.loads(line).get("equivalent", False))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


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
    worker (it restarts on its next use), so no expression can hang a step. Workers start on first
    need; the most recently used one is lent first, so light loads stay on warm workers whose
    math-verify caches already know the answer forms. Thread-safe; a forked child gets fresh workers.

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
        # After a fork the parent's workers and the queue's lock belong to the parent: start over, kill nothing.
        self._idle: queue.LifoQueue[_VerifierProcess] = queue.LifoQueue()
        self._all = [_VerifierProcess() for _ in range(self.size)]
        for worker in self._all:
            self._idle.put(worker)

    def equivalent(self, gold: str, prediction: str, timeout_s: float) -> bool:
        """Whether math-verify finds ``prediction`` equal to ``gold``; False when it errs or overruns."""
        idle = self._idle
        worker = idle.get()
        try:
            return worker.equivalent(gold, prediction, timeout_s)
        finally:
            idle.put(worker)

    def stop(self) -> None:
        """Kill every worker (they restart when used again)."""
        for worker in self._all:
            worker.stop()


_verifier = VerifierPool(default_pool_size())
atexit.register(_verifier.stop)


def answers_equivalent(prediction: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether two answers are mathematically equal (``0.5`` vs ``\\frac{1}{2}``), within ``timeout_s``.

    Plain numbers and identical strings are decided in-process; anything else goes to math-verify
    in one of a pool of child processes (`VerifierPool`, ``RAPO_VERIFY_WORKERS`` of them), and a child
    that overruns is killed, so a pathological expression cannot hang a step.
    """
    if normalize_answer(prediction) == normalize_answer(gold) and prediction.strip():
        return True
    predicted, expected = _as_number(prediction), _as_number(gold)
    if predicted is not None and expected is not None:
        return math.isclose(predicted, expected, rel_tol=1e-9, abs_tol=1e-9)
    if not prediction.strip() or len(prediction) > 1000:
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
