"""The learning benchmark: held-out accuracy of RAPO against GRPO, with the warm-up-only policy as the floor.

Every run is `rapo train` on the embedded defaults (SmolLM2-135M-Instruct, procedural math, the sandboxed python
tool). GRPO is the same trainer with ``retrieval.enabled=false``. Runs of one seed share everything else: the
warm-up, the questions in the same order, the sampling seeds and the same budget of steps. The warm-up-only
floor is the held-out evaluation at step 0, right after the warm-up and before any RL step. It is the same
policy for RAPO and GRPO of a seed.

Two settings are measured:

- **with the warm-up** (the `make run` default);
- **without it** (``warmup.sft_steps=0``). SmolLM2 then never writes a tool tag by itself, so GRPO sees reward -1
  everywhere and gets no gradient. RAPO's hybrid rollouts see expert steps spliced into their context. The
  wrapper retrieves after every generation round, with or without a tool call
  (``retrieval.retrieve_after=any_round``, as the reference does), so they are shown expert steps even though
  the model never calls a tool. The benchmark reports whether that gives RAPO rewards (``rollouts with reward >
  -1``), updates (``updates``) and then held-out accuracy where GRPO has none.

Held-out accuracy is greedy, on the same 100 test questions for every run; curves are the mean over seeds with
a 95% t-interval across seeds. Everything goes to ``benchmarks/results/learning[_quick].json`` and ``.png``.

    python benchmarks/learning.py              # 3 seeds x {RAPO, GRPO} x {warm-up, none}
    python benchmarks/learning.py --quick      # 1 seed, 2 steps, 20 held-out questions (a smoke run, minutes)
    python benchmarks/learning.py --seeds 0 1 2 3 --set total_steps=16
    python benchmarks/learning.py --report-only   # the table and plot again, from the run folders
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see rapo_cli/train.py

from _report import RESULTS_DIR, report

METHODS = {"RAPO": [], "GRPO": ["retrieval.enabled=false"]}
"""Each method's overrides on top of the embedded defaults."""
SETTINGS = {"warm-up": [], "no warm-up": ["warmup.sft_steps=0"]}
"""The two starting points."""
QUICK = ["total_steps=2", "evaluation.heldout_tasks=20"]


def run_folder(output_root: Path, method: str, setting: str, seed: int) -> Path:
    return output_root / f"{method.lower()}-{setting.replace(' ', '')}-seed{seed}"


def train_one(method: str, setting: str, seed: int, overrides: list[str], folder: Path) -> None:
    """Train one run from scratch into ``folder``."""
    from rapo_agents.config import load_config
    from rapo_agents.trainer import RAPOTrainer

    config = load_config(None, [*METHODS[method], *SETTINGS[setting], *overrides, f"seed={seed}",
                                "logging.resume=false", "logging.plot=false", f"logging.output_dir={folder}"])
    RAPOTrainer(config).train()


def summarize(method: str, setting: str, seed: int, folder: Path) -> dict:
    """One finished run, read back from what it wrote: per-step history, held-out evaluations and seconds."""
    from rapo_agents.heldout import paired_difference
    from rapo_agents.metrics import read_metrics

    history = [record for record in read_metrics(folder / "metrics.jsonl") if record["step"] > 0]
    heldout = read_metrics(folder / "eval" / "metrics.jsonl")
    profile = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
    difference = paired_difference(heldout[0]["correct"], heldout[-1]["correct"]) if len(heldout) > 1 else None

    def mean_of(key: str) -> float:
        return statistics.fmean(record.get(key, 0.0) for record in history) if history else 0.0

    return {
        "method": method, "setting": setting, "seed": seed, "folder": str(folder),
        "heldout": [{key: evaluation[key] for key in ("step", "eval/accuracy", "eval/accuracy_ci_low",
                                                      "eval/accuracy_ci_high", "eval/format_rate", "correct")}
                    for evaluation in heldout],
        "difference": None if difference is None else vars(difference),
        "rewarded_rollouts": mean_of("reward/above_penalty_rate"),
        "spliced_rollouts": mean_of("retrieval/rollouts_with_retrieval"),
        "updates": sum(1 for record in history if not record.get("optim/skipped_zero_advantage")),
        "reward_mean": mean_of("reward/mean") if history else float("nan"),
        # generation and tool time overlap inside the rollout phase
        "seconds": sum(profile.values()) - profile.get("generate", 0) - profile.get("tools", 0),
    }


def mean_and_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval across seeds (0 for one seed)."""
    if len(values) < 2:
        return (values[0] if values else float("nan")), 0.0
    t_975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571}.get(len(values), 2.262)
    return statistics.fmean(values), t_975 * statistics.stdev(values) / math.sqrt(len(values))


def rapo_against_grpo(runs: list[dict]) -> list[dict]:
    """RAPO's final held-out accuracy minus GRPO's, paired over the same questions, for each seed and setting."""
    from rapo_agents.heldout import paired_difference

    final = {(run["method"], run["setting"], run["seed"]): run["heldout"][-1]["correct"] for run in runs
             if run["heldout"]}
    return [{"setting": setting, "seed": seed, **vars(paired_difference(grpo, final[("RAPO", setting, seed)]))}
            for (method, setting, seed), grpo in final.items()
            if method == "GRPO" and ("RAPO", setting, seed) in final]


def plot(runs: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(run["setting"] for run in runs))
    figure, axes = plt.subplots(1, len(settings), figsize=(5.2 * len(settings), 3.6), squeeze=False)
    for axis, setting in zip(axes.flat, settings, strict=True):
        for method in METHODS:
            chosen = [run for run in runs if run["setting"] == setting and run["method"] == method]
            if not chosen:
                continue
            steps = sorted({point["step"] for run in chosen for point in run["heldout"]})
            means, halves = [], []
            for step in steps:
                values = [p["eval/accuracy"] for run in chosen for p in run["heldout"] if p["step"] == step]
                mean, half = mean_and_interval(values)
                means.append(mean)
                halves.append(half)
            line, = axis.plot(steps, means, marker="o", label=f"{method} ({len(chosen)} seeds)")
            axis.fill_between(steps, [m - h for m, h in zip(means, halves, strict=True)],
                              [m + h for m, h in zip(means, halves, strict=True)], color=line.get_color(), alpha=0.2)
        axis.set_title(f"{setting}: held-out accuracy (step 0 = warm-up only)", fontsize=9)
        axis.set_xlabel("RL step")
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps, 20 held-out questions")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (0 with --quick)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value", help="overrides for every run")
    parser.add_argument("--output", default="runs/learning", help="where the run folders go")
    parser.add_argument("--report-only", action="store_true",
                        help="tabulate the finished run folders under --output again, without training")
    args = parser.parse_args()
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    overrides = (QUICK if args.quick else []) + list(args.set)
    loads = []  # the 1-minute load average at the end of each run: the machine is shared

    runs = []
    # Interleaved: every seed runs each method and setting before the next seed starts, so that a change of
    # machine load spreads over all of them instead of one.
    for seed in seeds:
        for setting in args.settings:
            for method in args.methods:
                folder = run_folder(Path(args.output), method, setting, seed)
                if not args.report_only:
                    print(f"== {method}, {setting}, seed {seed}")
                    train_one(method, setting, seed, overrides, folder)
                    loads.append(os.getloadavg()[0])
                elif not (folder / "profile.json").is_file():
                    raise SystemExit(f"--report-only: {folder} holds no finished run; train it first")
                runs.append(summarize(method, setting, seed, folder))

    rows = []
    for setting in args.settings:
        # The methods of a seed share the warm-up, so one method's step-0 evaluations are the floor, one per seed.
        floor = [run["heldout"][0]["eval/accuracy"] for run in runs if run["setting"] == setting
                 and run["method"] == args.methods[0] and run["heldout"] and run["heldout"][0]["step"] == 0]
        if floor and setting == "warm-up":
            mean, half = mean_and_interval(floor)
            rows.append({"setting": setting, "method": "warm-up only", "seeds": len(floor),
                         "accuracy before": mean, "accuracy after": mean, "± across seeds": half})
        for method in args.methods:
            chosen = [run for run in runs if run["setting"] == setting and run["method"] == method]
            before = [run["heldout"][0]["eval/accuracy"] for run in chosen if run["heldout"]]
            after = [run["heldout"][-1]["eval/accuracy"] for run in chosen if run["heldout"]]
            deltas = [run["difference"]["mean"] for run in chosen if run["difference"]]
            mean_after, half = mean_and_interval(after)
            rows.append({
                "setting": setting, "method": method, "seeds": len(chosen),
                "accuracy before": statistics.fmean(before) if before else float("nan"),
                "accuracy after": mean_after, "± across seeds": half,
                "difference": statistics.fmean(deltas) if deltas else float("nan"),
                "seeds with CI > 0": sum(1 for run in chosen if run["difference"] and run["difference"]["low"] > 0),
                "rollouts with reward > -1": statistics.fmean(run["rewarded_rollouts"] for run in chosen),
                "rollouts spliced": statistics.fmean(run["spliced_rollouts"] for run in chosen),
                "updates": statistics.fmean(run["updates"] for run in chosen),
                "train reward": statistics.fmean(run["reward_mean"] for run in chosen),
                "seconds / run": statistics.fmean(run["seconds"] for run in chosen),
            })
    head_to_head = rapo_against_grpo(runs)
    name = "learning_quick" if args.quick else "learning"
    picture = plot(runs, RESULTS_DIR / f"{name}.png", f"RAPO vs GRPO, held-out accuracy, seeds {seeds}")
    columns = ["setting", "method", "seeds", "accuracy before", "accuracy after", "± across seeds", "difference",
               "seeds with CI > 0", "rollouts with reward > -1", "rollouts spliced", "updates", "train reward",
               "seconds / run"]
    report(name, "held-out accuracy (greedy): warm-up only, RAPO and GRPO, same budget", columns, rows,
           extra={"overrides": overrides, "seeds": seeds, "runs": runs, "rapo_minus_grpo": head_to_head,
                  "plot": str(picture),
                  "load_average_per_run": loads,  # empty when the runs are only re-tabulated
                  "reported_from_existing_runs": args.report_only})
    if loads:
        print(f"load average (1 min) at the end of each run: median {statistics.median(loads):.2f} "
              f"(min {min(loads):.2f}, max {max(loads):.2f}) on {os.cpu_count()} cores")
    for comparison in head_to_head:
        print(f"RAPO - GRPO after RL, {comparison['setting']}, seed {comparison['seed']}: {comparison['mean']:+.2f} "
              f"[{comparison['low']:+.2f}, {comparison['high']:+.2f}] (paired over the same questions)")
    print(f"curves: {picture}")


if __name__ == "__main__":
    main()
