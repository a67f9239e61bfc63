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

import contextlib
import importlib.util
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapo_tools.jsonl import JsonlReader, dumps_line

if TYPE_CHECKING:
    from rapo_agents.config import LoggingConfig

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


class PhaseTimer:
    """Seconds spent per phase of a run in this process (``prepare``, ``warmup``, ``rollout``, ``update``, ...).

    Example:
        >>> timer = PhaseTimer()
        >>> timer.add("update", 1.5); timer.add("update", 0.5)
        >>> with timer.time("eval"):
        ...     pass
        >>> timer.seconds["update"], sorted(timer.seconds)
        (2.0, ['eval', 'update'])
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        """Seconds per phase, in the order the phases first ran."""

    def add(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` more to ``phase``."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def time(self, phase: str) -> Iterator[None]:
        """Count the wall time of the ``with`` block to ``phase``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)


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


SMOOTHING_STEPS = 3
"""Window of the moving mean drawn over the training reward (one step's reward is a mean over few questions)."""
FEW_EVALUATIONS = 5
"""Up to this many held-out evaluations are drawn as points with error bars, not as a band."""


def read_history(directory: Path) -> list[dict[str, Any]]:
    """The training steps' records of the run in ``directory`` (step 0 holds the warm-up's, not a step's)."""
    path = directory / "metrics.jsonl"
    return [record for record in read_metrics(path) if record["step"] > 0] if path.is_file() else []


@contextlib.contextmanager
def run_loggers(directory: Path, config: LoggingConfig, run_config: Mapping[str, Any]
                ) -> Iterator[tuple[MetricsLogger, MetricsLogger]]:
    """A training run's metrics logger and its held-out evaluations' (``directory/eval``), as ``config`` says;
    its notes (a missing sink) are printed."""
    with MetricsLogger(
        directory, tensorboard=config.tensorboard, wandb=config.wandb, swanlab=config.swanlab,
        project=config.project, run_name=directory.name, config=run_config,
    ) as logger, MetricsLogger(directory / "eval", tensorboard=config.tensorboard) as eval_logger:
        for note in logger.notes:
            print(note)
        yield logger, eval_logger


def moving_mean(values: Sequence[float], window: int = SMOOTHING_STEPS) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start).

    Example:
        >>> moving_mean([0.0, 1.0, 2.0, 3.0], window=2)
        [0.0, 0.5, 1.5, 2.5]
    """
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def curve_panels(runs: Mapping[str, Sequence[Mapping[str, Any]]],
                 keys: Sequence[str] = MAIN_CURVES) -> tuple[list[str], dict[str, float]]:
    """The keys worth a panel (present, and not one value throughout) and the constant ones with their value.

    Example:
        >>> curve_panels({"run": [{"step": 1, "a": 1.0, "b": 0.0}, {"step": 2, "a": 2.0, "b": 0.0}]}, ["a", "b"])
        (['a'], {'b': 0.0})
    """
    panels, constant = [], {}
    for key in keys:
        values = {record[key] for records in runs.values() for record in records if record.get(key) is not None}
        if len(values) > 1:
            panels.append(key)
        elif values:
            constant[key] = float(values.pop())
    return panels, constant


def plot_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike[str],
    keys: Sequence[str] = MAIN_CURVES,
    title: str | None = None,
    heldout: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Path | None:
    """Plot metric curves of one or more runs (label -> records) into a PNG grid; None when nothing to plot.

    ``heldout`` (label -> ``eval/metrics.jsonl`` records) adds a first panel: held-out accuracy with its
    confidence interval (error bars on points when there are few evaluations, else a band), next to the training
    reward, drawn with its moving mean. A series that never changes gets no panel: a note under the grid says
    "constant at X". The layout is constrained, so the figure title never covers a panel's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heldout = {label: [r for r in records if r.get("eval/accuracy") is not None]
               for label, records in (heldout or {}).items()}
    heldout = {label: records for label, records in heldout.items() if records}
    present, constant = curve_panels(runs, keys)
    panels = (["held-out accuracy"] if heldout else []) + present
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.9 * rows + (0.4 if constant else 0)),
                                squeeze=False, layout="constrained")
    for axis, key in zip(axes.flat, panels, strict=False):  # the grid may have spare panels
        if key == "held-out accuracy":
            for label, records in heldout.items():
                steps = [record["step"] for record in records]
                accuracy = [record["eval/accuracy"] for record in records]
                pairs = list(zip(records, accuracy, strict=True))
                low = [record.get("eval/accuracy_ci_low", value) for record, value in pairs]
                high = [record.get("eval/accuracy_ci_high", value) for record, value in pairs]
                if len(records) <= FEW_EVALUATIONS:
                    axis.errorbar(steps, accuracy, yerr=[[a - lo for a, lo in zip(accuracy, low, strict=True)],
                                                         [hi - a for a, hi in zip(accuracy, high, strict=True)]],
                                  fmt="o", capsize=4, markersize=4, label=label)
                else:
                    line, = axis.plot(steps, accuracy, marker="o", markersize=3, linewidth=1.5, label=label)
                    axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            axis.set_ylim(-0.02, 1.02)
            axis.set_title("held-out accuracy (95% CI)", fontsize=9)
        else:
            for label, records in runs.items():
                points = [(record["step"], record[key]) for record in records if record.get(key) is not None]
                if points:
                    steps, values = zip(*points, strict=True)
                    line, = axis.plot(steps, values, marker="o", markersize=2.5, linewidth=1.0, alpha=0.5,
                                      label=label)
                    if key == "reward/mean" and len(values) > SMOOTHING_STEPS:
                        axis.plot(steps, moving_mean(values), linewidth=2.0, color=line.get_color())
            axis.set_title(key if key != "reward/mean" else
                           f"training reward (line: mean of {SMOOTHING_STEPS} steps)", fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    if constant:
        figure.supxlabel("constant throughout (no panel): " + ", ".join(f"{key} = {value:.3g}"
                                                                        for key, value in constant.items()),
                         fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
