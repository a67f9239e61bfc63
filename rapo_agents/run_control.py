"""Run control of `RAPOTrainer`: one SIGINT/SIGTERM handler for every phase of a run, and a lock on the run folder.

`RunControl` replaces the default handlers for the whole run. The first signal prints at once what will happen,
which depends on the phase the run is in:

- ``warm-up episodes`` and ``evaluation`` stop at once (the phase is abandoned: `PhaseInterrupted` is raised
  inside it and caught by `RunControl.phase`), and the trainer saves a checkpoint; the next run redoes them;
- ``warm-up`` (behaviour cloning) stops after the current optimiser step; the next run does the warm-up again from
  the model's own weights (its optimiser moments and episode order are not kept, and a warm-up continued without
  them is another one);
- ``step`` (rollouts and update) finishes the step, then the trainer saves a checkpoint.

A second signal stops at once, without a checkpoint (``KeyboardInterrupt``).

`RunFolderLock` holds an ``fcntl`` lock on ``<run folder>/.rapo-train.lock`` while a run uses the folder, so a
second ``rapo train`` on the same folder is refused (`RunFolderBusyError`) instead of interleaving two runs'
checkpoints and metrics. The lock is released by the kernel if the process dies.

Example:
    >>> import tempfile
    >>> with RunFolderLock(tempfile.mkdtemp()), RunControl() as control:
    ...     with control.phase("evaluation", abortable=True):
    ...         pass
    ...     control.requested
    False
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

LOCK_FILE = ".rapo-train.lock"
"""Name of the lock file in a run folder."""

ON_SIGNAL = {
    "warm-up episodes": "stopping the warm-up now and saving a checkpoint; the next run redoes the warm-up",
    "warm-up": "stopping after the current warm-up step and saving a checkpoint; the next run redoes the warm-up",
    "evaluation": "stopping the held-out evaluation now and saving a checkpoint; the next run evaluates again",
    "step": "finishing this step (rollouts and update), then saving a checkpoint and stopping",
    "": "saving a checkpoint and stopping",
}
"""What the first signal does, by phase (printed at once)."""


class PhaseInterrupted(BaseException):
    """Raised inside an abortable phase by the first signal; `RunControl.phase` catches it.

    A `BaseException`, like ``KeyboardInterrupt``, so that no ``except Exception`` on the way swallows it.
    """


class RunFolderBusyError(RuntimeError):
    """Another process is training in the run folder."""


class RunControl:
    """The signal handler of a whole run (see the module docstring).

    Attributes:
        requested: True once a signal asked the run to stop.
        signal_name: ``SIGINT`` or ``SIGTERM`` once one came.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, stream: TextIO | None = None) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self.current = ""
        self._abortable = False
        self._stream = stream
        self._previous: dict[int, Any] = {}

    def _say(self, text: str) -> None:
        print(text, file=self._stream or sys.stderr, flush=True)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            self._say(f"second {name}: stopping at once, without a checkpoint")
            raise KeyboardInterrupt
        self.requested, self.signal_name = True, name
        self._say(f"{name}: {ON_SIGNAL.get(self.current, ON_SIGNAL[''])} (a second signal stops at once, "
                  "without a checkpoint)")
        if self._abortable:
            self._abortable = False
            raise PhaseInterrupted(name)

    @contextlib.contextmanager
    def phase(self, name: str, abortable: bool = False) -> Iterator[None]:
        """Run the block as phase ``name``: an abortable phase ends at the first signal; in any other, the block's
        code checks `requested` where it can stop (a step boundary). Callers skip a phase when `requested` is
        already set."""
        previous = self.current, self._abortable
        self.current, self._abortable = name, abortable
        try:
            yield
        except PhaseInterrupted:
            pass
        finally:
            self.current, self._abortable = previous

    def __enter__(self) -> RunControl:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class RunFolderLock:
    """An exclusive ``fcntl`` lock on a run folder, re-entrant within one process.

    Raises:
        RunFolderBusyError: on entry, when another process holds it.
    """

    _held: dict[Path, int] = {}  # folder -> depth, in this process

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).resolve()
        self._handle: Any = None

    def __enter__(self) -> RunFolderLock:
        if self.folder in self._held:
            self._held[self.folder] += 1
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held while the run lasts)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            handle.close()
            raise RunFolderBusyError(
                f"{self.folder} is in use by another `rapo train` (pid {owner}); train in another folder with "
                "logging.output_dir=runs/<other name>, or wait for that run to end") from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        self._held[self.folder] = 1
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._held[self.folder] -= 1
        if self._held[self.folder] == 0:
            del self._held[self.folder]
            if self._handle is not None:
                fcntl.flock(self._handle, fcntl.LOCK_UN)
                self._handle.close()
