"""Atomic checkpoints that resume a run exactly, and a clean stop on Ctrl-C / SIGTERM.

A checkpoint is a folder ``step_000012/`` holding ``state.pt`` (model, optimizer, RNG states,
the trainer's counters and data position) and ``trainer_state.json`` (the same counters, for
people). It is written under a temporary name and renamed into place, so a crash never leaves
a half-written checkpoint that resuming would pick up; only the newest ``keep_last`` are kept.

Example:
    >>> import tempfile, torch
    >>> manager = CheckpointManager(tempfile.mkdtemp(), keep_last=1)
    >>> model = torch.nn.Linear(2, 1)
    >>> _ = manager.save(3, {"model": model.state_dict(), "trainer": {"step": 3}})
    >>> manager.load_latest()["trainer"]["step"]
    3
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STATE_FILE = "state.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read."""


def rng_state() -> dict[str, Any]:
    """The states of every random generator a run draws from (Python, NumPy, torch, CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Saves, lists, loads and prunes the checkpoints of one run folder.

    Args:
        directory: where ``step_*`` folders live (created on first save).
        keep_last: how many checkpoints to keep; older ones are deleted after each save.
    """

    def __init__(self, directory: str | os.PathLike[str], keep_last: int = 2):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint folders, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = STEP_DIR.match(path.name)
            if match and (path / STATE_FILE).is_file():
                found.append((int(match.group(1)), path))
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write ``state`` as checkpoint ``step`` atomically, then prune old ones. Returns its folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step_{step:06d}"
        temporary = self.directory / f".tmp_step_{step:06d}_{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
        torch.save(state, temporary / STATE_FILE)
        readable = state.get("trainer", {})
        (temporary / "trainer_state.json").write_text(json.dumps(readable, indent=2, default=str), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        os.replace(temporary, final)
        for old in self.checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Read one checkpoint folder's state.

        Raises:
            CheckpointError: when the file is missing or unreadable.
        """
        file = Path(path) / STATE_FILE
        try:
            # The state holds NumPy RNG tuples and Python objects that the weights-only loader refuses.
            return torch.load(file, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
            raise CheckpointError(f"cannot read checkpoint {file}: {error}") from error

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint's state, or None when the run folder has none."""
        latest = self.latest()
        return None if latest is None else self.load(latest)


class GracefulInterrupt:
    """Turn the first SIGINT/SIGTERM into a flag that a training loop checks between steps.

    The loop then saves a checkpoint and returns; a second signal interrupts at once
    (KeyboardInterrupt). Only the main thread can install handlers; elsewhere this is a no-op.

    Example:
        >>> with GracefulInterrupt() as interrupt:
        ...     interrupt.requested
        False
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
