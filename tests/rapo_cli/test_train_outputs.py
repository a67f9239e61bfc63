"""What a finished `rapo train` leaves behind reads as the run went (issue #29): the training reward is shown
smoothed and over how many questions, the console summary is kept in the run folder, and curves.png has no
flat panels and draws a few held-out points as points with error bars."""

from __future__ import annotations

import os
import subprocess

import pytest


def test_a_finished_run_keeps_its_summary_with_the_smoothed_reward_and_the_questions_per_step(tiny_run, tmp_path):
    output_dir = tmp_path / "run"
    result = subprocess.run(tiny_run(output_dir, "total_steps=4", "sft_steps=0", "evaluation.heldout_tasks=2",
                                     "logging.plot=true"),
                            capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={**os.environ, "RAPO_DEBUG": "", "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (output_dir / "summary.txt").read_text()
    assert "last 3 steps (mean)" in summary and "2 questions x 2 rollouts per step" in summary
    assert "held-out accuracy" in summary and (output_dir / "curves.png").stat().st_size > 0


def test_constant_series_get_no_panel_but_a_note_with_their_value():
    from rapo_agents.metrics import curve_panels

    runs = {"RAPO": [{"step": step, "reward/mean": reward, "format_rate": 1.0}
                     for step, reward in ((1, 0.625), (2, 0.0), (3, 0.25))]}
    assert curve_panels(runs, ["reward/mean", "format_rate", "accuracy"]) == (["reward/mean"], {"format_rate": 1.0})


def test_the_training_reward_is_smoothed_by_a_moving_mean():
    from rapo_agents.metrics import SMOOTHING_STEPS, moving_mean

    assert SMOOTHING_STEPS == 3
    assert moving_mean([0.625, 0.0, 0.25, 0.0]) == pytest.approx([0.625, 0.3125, 0.291667, 0.083333], abs=1e-6)


def test_the_curves_figure_uses_a_constrained_layout_so_titles_do_not_overlap(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from rapo_agents.metrics import plot_curves

    figures = []
    real_subplots = plt.subplots

    def recording_subplots(*args, **kwargs):
        figure, axes = real_subplots(*args, **kwargs)
        figures.append((figure, axes))
        return figure, axes

    monkeypatch.setattr(plt, "subplots", recording_subplots)
    runs = {"RAPO": [{"step": 1, "reward/mean": 0.6}, {"step": 2, "reward/mean": 0.0}]}
    heldout = {"RAPO": [{"step": 0, "eval/accuracy": 0.2, "eval/accuracy_ci_low": 0.1, "eval/accuracy_ci_high": 0.3},
                        {"step": 2, "eval/accuracy": 0.4, "eval/accuracy_ci_low": 0.3, "eval/accuracy_ci_high": 0.5}]}
    assert plot_curves(runs, tmp_path / "curves.png", title="runs/rapo", heldout=heldout) is not None
    figure, axes = figures[0]
    assert type(figure.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    heldout_axis = axes.flat[0]
    from matplotlib.collections import PolyCollection

    assert heldout_axis.containers  # error bars on the two points ...
    assert not any(isinstance(artist, PolyCollection) for artist in heldout_axis.collections)  # ... and no band
