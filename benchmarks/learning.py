"""RAPO against GRPO on the embedded defaults: same seeds, same questions, same budget; curves as PNG + JSON.

Both runs are `rapo train` on SmolLM2-135M-Instruct and procedural math; GRPO is the same trainer with
``retrieval.enabled=false`` (``configs/grpo.yaml``); ``--methods`` adds the other baselines of ``configs/``
(ARPO-style branching rollouts, plain on-policy). They share the seed, so they see the same questions in the
same order and the same sampling seeds; only the retrieval splices (and what they change) differ. Reported per
run: reward, accuracy and format rate over steps (curves), and their means over the first and the last third of
training.

    python benchmarks/learning.py            # the defaults of `rapo train` (about 10 min per run on 2 cores)
    python benchmarks/learning.py --quick    # 3 steps of 2 questions x 4 rollouts, short responses
    python benchmarks/learning.py --seeds 0 1 --set rollout_n=8   # more seeds, any override
    python benchmarks/learning.py --quick --methods RAPO GRPO ARPO on-policy
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see rapo_agents/cli/train.py

from _report import RESULTS_DIR, report

CURVES = ("reward/mean", "accuracy", "format_rate", "tool_calls/mean", "retrieval/count_mean", "response_tokens/mean")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHODS = {"RAPO": "default.yaml", "GRPO": "grpo.yaml", "ARPO": "arpo.yaml", "on-policy": "on_policy.yaml"}
"""Each method's config; the overrides and the seed apply on top of it."""
QUICK = ["total_steps=3", "train_batch_size=2", "ppo_mini_batch_size=2", "rollout_n=4",
         "max_response_tokens=192", "max_turn_tokens=96"]


def run_one(label: str, seed: int, overrides: list[str], output_root: Path) -> list[dict]:
    from rapo_agents.config import load_config
    from rapo_agents.trainer import RAPOTrainer

    config = load_config(CONFIGS / METHODS[label], [
        *overrides, f"seed={seed}", "logging.resume=false", "logging.plot=false",
        f"logging.output_dir={output_root / f'{label.lower()}-seed{seed}'}"])
    trainer = RAPOTrainer(config)
    return trainer.train().history


def phase_mean(history: list[dict], key: str, part: str) -> float:
    values = [record[key] for record in history if record.get(key) is not None]
    if not values:
        return float("nan")
    third = max(1, len(values) // 3)
    chosen = values[:third] if part == "first" else values[-third:]
    return sum(chosen) / len(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few short steps (minutes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value", help="overrides for every run")
    parser.add_argument("--methods", nargs="+", default=["RAPO", "GRPO"], choices=list(METHODS))
    parser.add_argument("--output", default="runs/learning", help="run folders of the methods")
    args = parser.parse_args()
    overrides = (QUICK if args.quick else []) + list(args.set)
    output_root = Path(args.output)

    from rapo_agents.metrics import plot_curves

    histories: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for label in args.methods:
            histories[f"{label} seed {seed}"] = run_one(label, seed, overrides, output_root)

    rows = []
    for name, history in histories.items():
        row = {"run": name, "steps": len(history)}
        for key in ("reward/mean", "accuracy", "format_rate"):
            row[f"{key} first third"] = phase_mean(history, key, "first")
            row[f"{key} last third"] = phase_mean(history, key, "last")
        row["retrievals / rollout"] = phase_mean(history, "retrieval/count_mean", "last")
        row["branches / step"] = phase_mean(history, "rollout/branches", "last")
        row["seconds / step"] = sum(r["time/step_s"] for r in history) / max(1, len(history))
        rows.append(row)
    name = "learning_quick" if args.quick else "learning"
    plot = plot_curves(histories, RESULTS_DIR / f"{name}.png", keys=CURVES,
                       title=f"{' vs '.join(args.methods)}, embedded defaults (same seeds and budget)")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}_curves.json").write_text(json.dumps(
        {label: [{key: record.get(key) for key in ("step", *CURVES)} for record in history]
         for label, history in histories.items()}, indent=1))
    columns = ["run", "steps", "reward/mean first third", "reward/mean last third", "accuracy first third",
               "accuracy last third", "format_rate first third", "format_rate last third", "retrievals / rollout",
               "branches / step", "seconds / step"]
    last = {label: [r["reward/mean last third"] for r in rows if r["run"].startswith(f"{label} seed")]
            for label in args.methods}
    extra = {"overrides": overrides, "seeds": args.seeds, "methods": args.methods, "plot": str(plot)}
    if last.get("RAPO") and last.get("GRPO"):
        extra["rapo_minus_grpo_reward_last_third"] = sum(last["RAPO"]) / len(last["RAPO"]) - sum(last["GRPO"]) / len(
            last["GRPO"])
    report(name, f"{' vs '.join(args.methods)} on the embedded defaults", columns, rows, extra=extra)
    print(f"curves: {plot}")


if __name__ == "__main__":
    main()
