"""Checkpoints you can use: the policy in Hugging Face format beside the trainer state, written atomically.

A checkpoint is a folder ``step_000012/`` holding

- the policy as ``save_pretrained`` writes it: ``config.json``, ``model.safetensors``, the tokenizer files and
  its chat template, so ``AutoModelForCausalLM.from_pretrained(folder)`` (and therefore vLLM and ``rapo eval
  --model folder``) loads it as it is; with ``model.lora`` on, the adapter instead (``adapter_model.safetensors``
  and ``adapter_config.json``: `rapo_agents.lora.load_adapted` rebuilds the model, ``rapo export`` merges it);
- ``trainer_state.pt``: optimizer moments, RNG states, data position and counters, only tensors and plain
  Python data, read back with ``torch.load(weights_only=True)`` so that a shared checkpoint cannot run code;
- ``trainer_state.json``: the counters and the run's config, for people and for `trained_config`.

It is written under a temporary name, flushed to disk (``fsync``) and renamed into place, so a crash never
leaves a half-written checkpoint that resuming would pick up, and there is always a complete checkpoint on
disk; only the newest ``keep_last`` are kept. Resuming takes the newest checkpoint that loads, and says which
newer ones it skipped and why.

Example:
    >>> import tempfile, torch
    >>> manager = CheckpointManager(tempfile.mkdtemp(), keep_last=1)
    >>> _ = manager.save(3, {"trainer": {"step": 3}, "weights": {"w": torch.ones(2)}})
    >>> manager.load_latest()[1]["trainer"]["step"]
    3
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STATE_FILE = "trainer_state.pt"
SUMMARY_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or that holds more than tensors and plain data."""


def rng_state() -> dict[str, Any]:
    """The states of every random generator a run draws from (Python, NumPy, torch, CUDA), as tensors and plain
    data only (what ``torch.load(weights_only=True)`` reads)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss),
                  float(cached_gaussian)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` and the folder itself to disk, so a rename publishes complete files."""
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class CheckpointManager:
    """Saves, lists, loads and prunes the checkpoints of one run folder.

    Args:
        directory: where ``step_*`` folders live (created on first save).
        keep_last: how many checkpoints to keep (weights and trainer state together); older ones are deleted
            after each save.
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

    def save(self, step: int, state: dict[str, Any], model: Any = None, tokenizer: Any = None) -> Path:
        """Write checkpoint ``step`` atomically (the policy via ``save_pretrained``, ``state`` beside it), then
        prune old ones. Returns its folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step_{step:06d}"
        temporary = self.directory / f".tmp_step_{step:06d}_{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
        try:
            self._write(temporary, state, model, tokenizer)
        except BaseException:  # a full disk, an interrupt: give back the space the half-written copy holds
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        # Replacing a checkpoint of the same step: the old one is moved aside, not deleted, until the new one is
        # in place, so some complete checkpoint is on disk at every moment.
        retired = self.directory / f".old_step_{step:06d}_{os.getpid()}"
        if final.exists():
            os.replace(final, retired)
        os.replace(temporary, final)
        _fsync_folder(self.directory)  # the rename itself survives a crash
        shutil.rmtree(retired, ignore_errors=True)
        self._prune(step)
        return final

    @staticmethod
    def _write(folder: Path, state: dict[str, Any], model: Any, tokenizer: Any) -> None:
        """The checkpoint's files in ``folder``, flushed to disk."""
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(folder, safe_serialization=True)
        elif model is not None:  # a plain torch module: its weights alone
            from safetensors.torch import save_model

            save_model(model, str(folder / WEIGHTS_FILE))
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(folder)
        torch.save(state, folder / STATE_FILE)
        readable = state.get("trainer", {})
        (folder / SUMMARY_FILE).write_text(json.dumps(readable, indent=2, default=str), encoding="utf-8")
        _fsync_tree(folder)

    def _prune(self, step: int) -> None:
        """Delete all but the newest ``keep_last`` checkpoints up to ``step`` (the one just saved always stays).
        Newer ones (say, an unreadable checkpoint that the resume skipped) are left alone: a save never deletes
        itself to make room for them."""
        older = [path for path in self.checkpoints() if int(STEP_DIR.match(path.name).group(1)) < step]
        for old in older[: max(0, len(older) - (self.keep_last - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Read one checkpoint folder's trainer state (tensors and plain data only).

        Raises:
            CheckpointError: when the file is missing, unreadable, or holds anything but tensors and plain data.
        """
        file = Path(path) / STATE_FILE
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            # torch's weights-only unpickler names what it refused ("Unsupported global: GLOBAL builtins.open")
            # after a long explanation; corrupt bytes fail in the same unpickler with another reason.
            refused = re.search(r"Unsupported global: ([^\n]+)", str(error))
            if refused:
                raise CheckpointError(
                    f"refused to load {file}: it holds a Python object ({refused.group(1).strip()}) beyond tensors "
                    "and plain data, which a checkpoint written by rapo never does: a tampered or foreign file"
                ) from error
            raise CheckpointError(f"cannot read checkpoint {file}: the file is corrupt or truncated") from error
        except Exception as error:  # malformed pickles raise IndexError, KeyError, TypeError, EOFError, ...
            raise CheckpointError(f"cannot read checkpoint {file}: {type(error).__name__}: {error}") from error
        if not isinstance(state, dict):
            raise CheckpointError(f"cannot read checkpoint {file}: it holds a {type(state).__name__}, not a dict")
        return state

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads, as ``(folder, state)``, or None when there is none.

        A newer checkpoint that cannot be read (truncated, corrupt, tampered) is skipped with a warning that
        names it and says why.
        """
        for path in reversed(self.checkpoints()):
            try:
                return path, self.load(path)
            except CheckpointError as error:
                warnings.warn(f"skipping checkpoint {path.name}: {error}", stacklevel=2)
        return None


def trained_config(folder: str | os.PathLike[str]) -> Any:
    """The `TrainConfig` of the run that wrote checkpoint ``folder`` (from its ``trainer_state.json``), or None for
    a folder that is not a rapo checkpoint or whose config this version cannot read."""
    from rapo_agents.config import ConfigError, TrainConfig

    summary = Path(folder) / SUMMARY_FILE
    try:
        return TrainConfig.from_dict(json.loads(summary.read_text(encoding="utf-8"))["config"])
    except (OSError, ConfigError, ValueError, KeyError, TypeError):
        return None


def load_weights(model: torch.nn.Module, folder: str | os.PathLike[str]) -> None:
    """Load the safetensors weights of a checkpoint folder into ``model`` (tied weights included), or its LoRA
    adapter into an adapted ``model`` (`rapo_agents.lora`).

    Raises:
        CheckpointError: when the weights file is missing, unreadable or does not fit the model (a LoRA checkpoint
            for a fully fine-tuned model, or the other way round, included).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from rapo_agents.lora import has_adapter, is_adapted, load_adapter_weights

    if is_adapted(model) != has_adapter(folder):
        held, wanted = ("a LoRA adapter", "full weights") if has_adapter(folder) else ("full weights", "an adapter")
        raise CheckpointError(f"{folder} holds {held} but this run trains {wanted}: resume it with the model.lora "
                              "settings it was trained with, or start a new run folder")
    if is_adapted(model):
        try:
            load_adapter_weights(model, folder)
        except ValueError as error:
            raise CheckpointError(str(error)) from error
        return

    file = Path(folder) / WEIGHTS_FILE
    try:
        weights = load_file(file, device=str(next(model.parameters()).device))
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:  # a bad header: SafetensorError
        raise CheckpointError(f"cannot read the weights {file}: {error}") from error
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [key for key in missing if key not in tied]
    if missing or unexpected:
        raise CheckpointError(f"{file} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()
