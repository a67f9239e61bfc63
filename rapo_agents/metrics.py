"""Training metrics: JSONL per step, TensorBoard, optional W&B / SwanLab, and a PNG of the curves.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with MetricsLogger(folder, tensorboard=False) as logger:
    ...     logger.log(1, {"reward": 0.5})
    >>> read_metrics(folder / "metrics.jsonl")[0]["reward"]
    0.5
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rapo_tools.jsonl import JsonlReader, dumps_line

#: The curves of ``curves.png``, in panel order (missing ones are left out).
MAIN_CURVES = (
    "reward/mean",
    "accuracy",
    "format_rate",
    "tool_calls/mean",
    "response_tokens/mean",
    "retrieval/count_mean",
    "retrieval/z_ret_mean",
    "loss/clip_fraction",
    "loss/approx_kl",
    "optim/grad_norm",
    "time/step_s",
    "throughput/update_tokens_per_s",
)


class MetricsLogger:
    """Append one JSON object per training step to ``metrics.jsonl`` and mirror it to the enabled sinks.

    Args:
        directory: the run folder.
        tensorboard: write TensorBoard events under ``directory/tensorboard`` (when installed).
        wandb, swanlab: also log there, when the package is installed (else a note is printed once).
        project, run_name, config: passed to W&B / SwanLab.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        tensorboard: bool = True,
        wandb: bool = False,
        swanlab: bool = False,
        project: str = "rapo",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        self._file = self.path.open("ab")
        self._tensorboard = None
        self._wandb = None
        self._swanlab = None
        self.notes: list[str] = []
        if tensorboard:
            if importlib.util.find_spec("tensorboard") is None:
                self.notes.append("tensorboard is not installed; skipping TensorBoard logging")
            else:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(self.directory / "tensorboard"))
        if wandb:
            if importlib.util.find_spec("wandb") is None:
                self.notes.append("wandb is not installed; skipping W&B logging")
            else:
                import wandb as wandb_module

                self._wandb = wandb_module.init(project=project, name=run_name, config=dict(config or {}),
                                                dir=str(self.directory))
        if swanlab:
            if importlib.util.find_spec("swanlab") is None:
                self.notes.append("swanlab is not installed; skipping SwanLab logging")
            else:
                import swanlab as swanlab_module

                self._swanlab = swanlab_module.init(project=project, experiment_name=run_name,
                                                    config=dict(config or {}), logdir=str(self.directory))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the metrics of one step (non-finite values are written as null)."""
        clean = {key: _finite(value) for key, value in metrics.items()}
        self._file.write(dumps_line({"step": step, **clean}))
        self._file.flush()
        numeric = {key: value for key, value in clean.items() if isinstance(value, (int, float))}
        if self._tensorboard is not None:
            for key, value in numeric.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._swanlab is not None:
            self._swanlab.log(numeric, step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._swanlab is not None:
            self._swanlab.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, by step; a resumed run's repeated step keeps its last record, bad lines
    are skipped."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in JsonlReader(path, what="metric records"):
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]


def plot_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike[str],
    keys: Sequence[str] = MAIN_CURVES,
    title: str | None = None,
    heldout: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Path | None:
    """Plot metric curves of one or more runs (label -> records) into a PNG grid; None when nothing to plot.

    ``heldout`` (label -> ``eval/metrics.jsonl`` records) adds a first panel: held-out accuracy with its
    confidence band, next to the training reward.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heldout = {label: [r for r in records if r.get("eval/accuracy") is not None]
               for label, records in (heldout or {}).items()}
    heldout = {label: records for label, records in heldout.items() if records}
    present = [key for key in keys
               if any(record.get(key) is not None for records in runs.values() for record in records)]
    panels = (["held-out accuracy"] if heldout else []) + present
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.9 * rows), squeeze=False)
    for axis, key in zip(axes.flat, panels, strict=False):  # the grid may have spare panels
        if key == "held-out accuracy":
            for label, records in heldout.items():
                steps = [record["step"] for record in records]
                line, = axis.plot(steps, [record["eval/accuracy"] for record in records], marker="o",
                                  markersize=3, linewidth=1.5, label=label)
                low = [record.get("eval/accuracy_ci_low", record["eval/accuracy"]) for record in records]
                high = [record.get("eval/accuracy_ci_high", record["eval/accuracy"]) for record in records]
                axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            axis.set_ylim(-0.02, 1.02)
        else:
            for label, records in runs.items():
                points = [(record["step"], record[key]) for record in records if record.get(key) is not None]
                if points:
                    steps, values = zip(*points, strict=True)
                    axis.plot(steps, values, marker="o", markersize=2.5, linewidth=1.3, label=label)
        axis.set_title(key if key != "reward/mean" else "training reward (reward/mean)", fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
