"""The learning benchmark: RAPO against GRPO where a retrieved step carries information, with the paper's ablations.

Every run is `rapo train` on an embedded task (SmolLM2-135M-Instruct, generated questions, real tools):

- ``qa``: 1-3-hop questions over the generated knowledge base with ``<search>`` (``configs/qa.yaml``);
- ``qa-2hop``: the same config with only the 2-hop questions (``data.env_kwargs.hops=[2]``) for training, the
  buffer, the warm-up and the held-out evaluation: every splice there can hand the rollout the hop it needs;
- ``math-multistep``: procedural math in two dependent python calls (``configs/math_multistep.yaml``);
- ``math``: the `make run` default (one python call; a third row, where RAPO is expected to equal GRPO).

Methods (``METHODS``): GRPO (retrieval off), RAPO, and the paper's Table 3 ablations: RAPO with random retrieval
(step traces drawn at random from the buffer), without the retrieval reward (``advantage_weight=0``) and without
importance shaping (``shaping_weight=0``). Settings: with the warm-up (the default) and without it
(``warmup.sft_steps=0``, twice the steps).

**Shared work.** The methods of one (task, setting, seed) start from one shared run folder trained to step 0:
the warm-up and the step-0 held-out evaluation run once, and every method resumes from its checkpoint (same
weights, same RNG state, same question order), so their step-0 evaluations are identical by construction.

**Resumable.** A finished run leaves ``benchmark_done.json``; a rerun skips it, so the benchmark can be run in
parts (``--tasks qa --methods GRPO RAPO --seeds 0 1``) and tabulated at the end (``--report-only``).

**The comparison.** RAPO − GRPO after RL is paired over the same held-out questions and pooled over seeds
(percentile bootstrap over question-seed pairs), with the per-seed differences beside it and their mean with a
t-interval over seeds (which, unlike the bootstrap over questions, counts the noise of training). Power: two methods
that disagree on a fraction d of the paired questions give a standard error of about sqrt(d / n) for n pairs; at
d = 0.2 (what two trained policies of one seed showed on the math task), telling a 5-point difference at 95%
with 80% power needs n = (1.96 + 0.84)^2 * 0.2 / 0.05^2 = 627 pairs: 200 held-out questions (the QA config's)
over 5 seeds give 1,000, 100 math questions over 5 seeds give 500 (a 5.6-point detectable difference). Over
seeds, the spread of the per-seed differences decides: on QA seeds 0-4 it was 0.024 (standard deviation), so an
interval of ±0.023 (the size of the difference seen) takes about 7 seeds.

**The mechanism** (the paper's Fig. 3/4), per RAPO run, means over its steps: the share of hybrid rollouts that got
a splice and the splices skipped for the budget; reward, response tokens and tool calls of spliced against
unspliced rollouts; the step entropy before and after a splice (what the retrieval reward scores); rollout and
update seconds per step. On multi-hop QA, `_splices` adds what each splice carried (the hop the rollout needed, one
it had, or another question's), the randomised effect of a splice at the first tool round by hop count, and every
comparison split by hop count. Everything goes to ``benchmarks/results/learning[_quick].json`` and ``.png`` (the
curves), and ``learning[_quick]_differences.png`` (each method against GRPO, per seed and pooled both ways).

    python benchmarks/learning.py                 # the full plan (see --help); resumable
    python benchmarks/learning.py --quick         # QA, 1 seed, RAPO and GRPO, 2 steps, 20 held-out questions
    python benchmarks/learning.py --tasks qa --methods GRPO RAPO --seeds 0 1 2 3 4
    python benchmarks/learning.py --report-only   # the tables and plot again, from the run folders
    python benchmarks/learning.py --report-only --tasks qa --methods GRPO RAPO --settings warm-up \
        --seeds 5 6 --with-report docs/results/learning_qa_hybrid_share.json   # pooled with earlier seeds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see rapo_cli/train.py

from _report import CONFIGS, RESULTS_DIR, report
from _splices import (after_two_hops, first_round_effects, group_ids, heldout_hops, pooled, splice_content,
                      training_chains)

TASKS = {"qa": (CONFIGS / "qa.yaml", []), "qa-2hop": (CONFIGS / "qa.yaml", ["data.env_kwargs.hops=[2]"]),
         "math-multistep": (CONFIGS / "math_multistep.yaml", []), "math": (None, [])}
"""Each task's config (None: the embedded default) and its overrides."""
METHODS = {
    "GRPO": ["retrieval.enabled=false"],
    "RAPO": [],
    "RAPO random retrieval": ["retrieval.random=true"],
    "RAPO no retrieval reward": ["algorithm.advantage_weight=0"],
    "RAPO no shaping": ["algorithm.shaping_weight=0"],
    "RAPO TIS": ["algorithm.rollout_correction=tis"],
    "RAPO on-policy baseline": ["algorithm.baseline=on_policy"],
    "RAPO spliced out of the loss": ["algorithm.spliced_loss=false"],
    "RAPO own rollouts only": ["algorithm.spliced_loss=false", "algorithm.baseline=on_policy",
                               "algorithm.advantage_weight=0"],
    "GRPO two rollouts per question": ["retrieval.enabled=false", "rollout_n=2"],
    "RAPO first round only": ["retrieval.retrieve_after=first_round"],
    "RAPO three of four hybrid": ["retrieval.no_retrieve_first_k=1"],
    "RAPO no stand-in for final steps": ["retrieval.final_steps=skip"],
}
"""Each method's overrides on top of its task's config (``RAPO TIS``: RAPO with truncated importance sampling
against the int8 sampler; ``RAPO on-policy baseline``: ``A_acc``'s group mean from the unspliced rollouts only;
``RAPO spliced out of the loss``: spliced rollouts shape the group's baseline but are not trained on; ``RAPO own
rollouts only``: neither, and no ``A_ret`` (GRPO on the unspliced rollouts, retrieval still on); ``GRPO two rollouts
per question``: GRPO on as many of its own rollouts per question as RAPO trains on multi-step math, about 2 of 4;
``RAPO first round only``: one retrieval draw per hybrid rollout, after its first round, so that its unspliced
rollouts are not selected for being short; ``RAPO three of four hybrid``: 1 of each group's 4 rollouts on-policy
and 3 hybrid, the CPU default until 2026-12, instead of the paper's half (8 of 16); ``RAPO no stand-in for final
steps``: where the retrieved step the selection picks is a final answer, nothing is spliced, instead of the best
other candidate; all `VARIANTS`)."""
ABLATIONS = ("RAPO random retrieval", "RAPO no retrieval reward", "RAPO no shaping")
VARIANTS = ("RAPO TIS", "RAPO on-policy baseline", "RAPO spliced out of the loss", "RAPO own rollouts only",
            "GRPO two rollouts per question", "RAPO first round only", "RAPO three of four hybrid",
            "RAPO no stand-in for final steps")
"""Settings that are not the paper's (`docs/training.md`), compared with RAPO and GRPO; not part of `PLAN`."""
SETTINGS = {"warm-up": [], "no warm-up": ["warmup.sft_steps=0", "total_steps=20"]}
"""The two starting points; without the warm-up the run gets twice the steps."""
PLAN = {"tasks": ["qa", "math-multistep"], "methods": ["GRPO", "RAPO"], "seeds": [0, 1, 2, 3, 4],
        "ablation_tasks": ["qa"], "ablation_seeds": [0, 1, 2], "no_warmup_seeds": [0, 1, 2]}
"""The full benchmark: RAPO and GRPO on both tasks over 5 seeds, the ablations on QA over 3, and the no-warm-up
setting on both tasks over 3."""
QUICK = ["total_steps=2", "evaluation.heldout_tasks=20"]
DONE = "benchmark_done.json"


def retrieves(method: str) -> bool:
    """Whether ``method``'s rollouts splice retrieved steps (GRPO's and its variants' do not)."""
    return "retrieval.enabled=false" not in METHODS[method]


def run_folder(root: Path, task: str, setting: str, seed: int, method: str) -> Path:
    slug = method.lower().replace(" ", "-")
    return root / task / setting.replace(" ", "") / f"seed{seed}" / slug


def make_config(task: str, setting: str, seed: int, overrides: list[str], folder: Path, method: str | None):
    from rapo_agents.config import load_config

    method_overrides = METHODS[method] if method else ["retrieval.enabled=false", "total_steps=0"]
    config_path, task_overrides = TASKS[task]
    return load_config(str(config_path) if config_path else None, [
        *task_overrides, *SETTINGS[setting], *overrides, *method_overrides, f"seed={seed}", "logging.plot=false",
        "logging.progress=false", f"logging.output_dir={folder}"])


def train_to_the_end(config: Any, folder: Path) -> None:
    """Train ``config`` in ``folder`` and mark it finished; a run stopped by a signal stops the whole benchmark
    (its checkpoint stays, unmarked, so that the same command resumes it) instead of going on to the next run."""
    from rapo_agents.trainer import RAPOTrainer

    started = time.perf_counter()
    if RAPOTrainer(config).train().interrupted:
        raise SystemExit(f"stopped in {folder}, which keeps its checkpoint: run the same command again to resume")
    (folder / DONE).write_text(json.dumps({"seconds": time.perf_counter() - started,
                                           "load_average": os.getloadavg()[0]}))


def train_base(task: str, setting: str, seed: int, overrides: list[str], root: Path) -> Path:
    """The shared start of a (task, setting, seed): the warm-up and the step-0 held-out evaluation, once."""
    folder = run_folder(root, task, setting, seed, "shared-start")
    if not (folder / DONE).is_file():
        print(f"== shared start: {task}, {setting}, seed {seed}")
        train_to_the_end(make_config(task, setting, seed, overrides, folder, None), folder)
    return folder


def train_method(task: str, setting: str, seed: int, method: str, overrides: list[str], root: Path) -> Path:
    """One method's run, resumed from the shared start (copied once); skipped when already finished."""
    folder = run_folder(root, task, setting, seed, method)
    if (folder / DONE).is_file():
        return folder
    base = train_base(task, setting, seed, overrides, root)
    if not folder.exists():
        shutil.copytree(base, folder, ignore=shutil.ignore_patterns(DONE, "*.lock", "events.out.tfevents.*"))
    print(f"== {method}: {task}, {setting}, seed {seed}")
    train_to_the_end(make_config(task, setting, seed, overrides, folder, method), folder)
    return folder


def nanmean(values) -> float:
    kept = [value for value in values if value is not None and not math.isnan(value)]
    return statistics.fmean(kept) if kept else float("nan")


def summarize(task: str, setting: str, seed: int, method: str, folder: Path) -> dict:
    """One finished run, read back from what it wrote: held-out evaluations, mechanism means, seconds, load; on
    multi-hop QA also what its splices carried and did, and its held-out questions' hop counts (`_splices`)."""
    from rapo_agents.heldout import paired_difference
    from rapo_agents.metrics import read_metrics

    history = [record for record in read_metrics(folder / "metrics.jsonl") if record["step"] > 0]
    heldout = read_metrics(folder / "eval" / "metrics.jsonl")
    done = json.loads((folder / DONE).read_text(encoding="utf-8"))
    difference = paired_difference(heldout[0]["correct"], heldout[-1]["correct"]) if len(heldout) > 1 else None

    def mean_of(key: str) -> float:
        return nanmean(record.get(key) for record in history)

    mechanism_keys = [key for key in (history[0] if history else {}) if key.startswith("mechanism/")]
    mechanism = {key.removeprefix("mechanism/"): mean_of(key) for key in mechanism_keys}
    lines = (folder / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    trajectories = [json.loads(line) for line in lines]  # read once for every table
    mechanism |= within_group_splice_effect(trajectories)
    splices = {}
    if retrieves(method):
        mechanism |= unspliced_selection(folder, trajectories)
    if task.startswith("qa"):  # what a splice carried, and what the policy did at the second hop of 3-hop questions
        chains = training_chains(folder)
        splices = {"after_two_hops": after_two_hops(trajectories, chains),
                   "heldout_hops": heldout_hops(folder, heldout[-1]) if heldout else None}
        if retrieves(method):
            mechanism |= splice_content(trajectories, chains)
            splices["first_round_effects"] = first_round_effects(trajectories, chains)
    return {
        "task": task, "setting": setting, "seed": seed, "method": method, "folder": str(folder),
        "decoded": decoded_formats(folder),
        "heldout": [{key: value for key, value in evaluation.items()
                     if key in ("step", "correct") or key.startswith("eval/accuracy")} for evaluation in heldout],
        "difference": None if difference is None else vars(difference),
        "rewarded_rollouts": mean_of("reward/above_penalty_rate"),
        "spliced_rollouts": mean_of("retrieval/rollouts_with_retrieval"),
        "hybrid_splice_rate": mean_of("retrieval/hybrid_splice_rate"),
        "skipped_splices": sum(record.get("retrieval/skipped_splices", 0.0) for record in history),
        "updates": sum(1 for record in history if not record.get("optim/skipped_zero_advantage")),
        "train_reward": mean_of("reward/mean"),
        "rollout_s_per_step": mean_of("time/rollout_s"),
        "update_s_per_step": mean_of("time/update_s"),
        "sampler_kl_k3": mean_of("rollout_correction/kl_k3"),
        "truncated_fraction": mean_of("rollout_correction/truncated_fraction"),
        "mechanism": mechanism,
        "seconds": done["seconds"], "load_average": done["load_average"], **splices,
    }


EARLIER_FORMATS = {"rollout": "int8", "evaluation": "int8"}
"""What runs from before 2026-12-06 decoded with (their reports do not say): int8, the CPU default then."""


def decoded_formats(folder: Path) -> dict[str, str]:
    """The fast CPU decoder's weight format of a run's rollouts and of its held-out evaluation, from its config.

    The evaluation's format changes its accuracy (int8 flips greedy answers at near ties: docs/training.md, "int8 or
    fp32"), so runs evaluated in different formats are never pooled (`with_earlier_runs`).
    """
    import torch
    import yaml

    from rapo_agents.policies.llama_decoder import default_weight_format

    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    rollout = config["rollout"].get("weight_format") or default_weight_format(torch.device("cpu"))
    return {"rollout": rollout, "evaluation": config["evaluation"].get("weight_format") or rollout}


def within_group_splice_effect(trajectories: list[dict]) -> dict:
    """Reward of spliced rollouts minus that of the unspliced rollouts of the same group (same question, same
    step), averaged over the groups that hold both: the comparison of the paper's Fig. 3 without the confound that
    splices happen more on longer, harder questions. Also the share of each kind that the response budget cut, and
    which groups carry a gradient: the share whose rewards differ (a group that scores alike has advantage 0), and
    the share where only a splice made them differ (the policy's own rollouts all scored alike)."""
    groups: dict[tuple[int, str], dict[bool, list[float]]] = {}
    cut: dict[bool, list[float]] = {True: [], False: []}  # rollouts cut by the response budget
    for group, trajectory in zip(group_ids(trajectories), trajectories, strict=True):
        spliced = any(step.get("retrieval") for step in trajectory["steps"])
        groups.setdefault(group, {True: [], False: []})[spliced].append(float(trajectory["reward"]))
        cut[spliced].append(float(trajectory["end_reason"] == "length"))
    deltas = [statistics.fmean(g[True]) - statistics.fmean(g[False]) for g in groups.values() if g[True] and g[False]]
    spread = [len(set(g[True] + g[False])) > 1 for g in groups.values()]
    spread_by_splice = [len(set(g[False])) <= 1 < len(set(g[True] + g[False])) for g in groups.values()]
    return {"within_group_spliced_minus_unspliced_reward": nanmean(deltas), "groups_with_both": float(len(deltas)),
            "length_cut_spliced": nanmean(cut[True]), "length_cut_unspliced": nanmean(cut[False]),
            "groups_with_reward_spread": nanmean(spread), "groups_spread_only_by_a_splice": nanmean(spread_by_splice)}


def unspliced_selection(folder: Path, trajectories: list[dict]) -> dict:
    """Which of the policy's own rollouts a RAPO group keeps: accuracy and tool calls of the on-policy rollouts
    (the first ``no_retrieve_first_k``, a plain sample of the policy) against the hybrid rollouts that got no
    splice. A hybrid rollout escapes every splice only if each of its retrieval rounds draws none, so the longer
    episodes (more rounds) are spliced more often, and the unspliced ones that remain are not a plain sample."""
    from rapo_agents.config import load_config
    from rapo_agents.trainer import retrieval_settings

    settings = retrieval_settings(load_config(str(folder / "config.yaml"), []))
    onpolicy, unspliced = [], []
    for trajectory in trajectories:
        if not settings.is_hybrid(trajectory["rollout_index"]):
            onpolicy.append(trajectory)
        elif not any(step.get("retrieval") for step in trajectory["steps"]):
            unspliced.append(trajectory)
    def correct(trajectory: dict) -> float | None:  # as the held-out evaluation scores: accuracy, or QA's exact match
        return trajectory["metrics"].get("accuracy", trajectory["metrics"].get("em"))

    return {"onpolicy_accuracy": nanmean(correct(t) for t in onpolicy),
            "hybrid_unspliced_accuracy": nanmean(correct(t) for t in unspliced),
            "onpolicy_tool_calls": nanmean(t["num_tool_calls"] for t in onpolicy),
            "hybrid_unspliced_tool_calls": nanmean(t["num_tool_calls"] for t in unspliced),
            "hybrid_unspliced_rollouts": float(len(unspliced))}


T_975 = (math.nan, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t 97.5% quantile by degrees of freedom (index), for 95% intervals over seeds."""


def mean_and_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval across seeds (nan for one seed: one seed has no spread)."""
    if len(values) < 2:
        return (values[0] if values else float("nan")), float("nan")
    degrees = len(values) - 1
    t_975 = T_975[min(degrees, len(T_975) - 1)]  # beyond 30 degrees, 30's (2.042 against 1.96 in the limit)
    return statistics.fmean(values), t_975 * statistics.stdev(values) / math.sqrt(len(values))


def against(runs: list[dict], method: str, baseline: str) -> list[dict]:
    """``method`` minus ``baseline`` after RL, per task and setting: paired over the same questions per seed, and
    pooled over seeds two ways. ``pooled`` and its CI: the question-seed pairs concatenated, a bootstrap that counts
    the evaluation's noise on the trained models but not the noise of training them; ``over seeds``: the mean of the
    per-seed differences with a t-interval across seeds, which counts both (and is wider). ``by hops`` (multi-hop
    QA, when every run knows its questions' hop counts): the pooled difference on the questions of each hop count."""
    from rapo_agents.heldout import paired_difference

    final = {(r["task"], r["setting"], r["seed"], r["method"]): r["heldout"][-1]["correct"] for r in runs
             if r["heldout"]}
    hops = {(r["task"], r["setting"], r["seed"], r["method"]): r.get("heldout_hops") for r in runs}
    rows = []
    for task, setting in dict.fromkeys((r["task"], r["setting"]) for r in runs):
        seeds = sorted(seed for (t, s, seed, m) in final if (t, s, m) == (task, setting, method)
                       and (task, setting, seed, baseline) in final)
        if not seeds:
            continue
        per_seed = {seed: vars(paired_difference(final[(task, setting, seed, baseline)],
                                                 final[(task, setting, seed, method)])) for seed in seeds}
        pooled = paired_difference(
            [c for seed in seeds for c in final[(task, setting, seed, baseline)]],
            [c for seed in seeds for c in final[(task, setting, seed, method)]])
        over_seeds, half_width = mean_and_interval([per_seed[seed]["mean"] for seed in seeds])
        by_hops = {}
        if all(hops[(task, setting, seed, name)] for seed in seeds for name in (method, baseline)):
            pairs = [(count, before, after) for seed in seeds
                     for count, before, after in zip(hops[(task, setting, seed, baseline)],
                                                     final[(task, setting, seed, baseline)],
                                                     final[(task, setting, seed, method)], strict=True)]
            by_hops = {count: vars(paired_difference([b for c, b, _ in pairs if c == count],
                                                     [a for c, _, a in pairs if c == count]))
                       for count in sorted({count for count, _, _ in pairs})}
        rows.append({"task": task, "setting": setting, "comparison": f"{method} - {baseline}", "seeds": len(seeds),
                     "pairs": sum(len(final[(task, setting, seed, method)]) for seed in seeds),
                     "pooled": pooled.mean, "CI low": pooled.low, "CI high": pooled.high,
                     "over seeds": over_seeds, "seeds CI low": over_seeds - half_width,
                     "seeds CI high": over_seeds + half_width,
                     "per seed": " ".join(f"{per_seed[s]['mean']:+.2f}" for s in seeds), "per_seed": per_seed,
                     "by hops": " ".join(f"{count}: {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                                         for count, d in by_hops.items()), "by_hops": by_hops})
    return rows


def plot(runs: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((run["task"], run["setting"]) for run in runs))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.8), squeeze=False,
                                layout="constrained")
    for axis, (task, setting) in zip(axes.flat, panels, strict=True):
        for method in METHODS:
            chosen = [r for r in runs if (r["task"], r["setting"], r["method"]) == (task, setting, method)]
            if not chosen:
                continue
            steps = sorted({point["step"] for run in chosen for point in run["heldout"]})
            stats = [mean_and_interval([p["eval/accuracy"] for run in chosen for p in run["heldout"]
                                        if p["step"] == step]) for step in steps]
            means = [mean for mean, _ in stats]
            halves = [half for _, half in stats]
            axis.errorbar(steps, means, yerr=halves, marker="o", capsize=3, label=f"{method} ({len(chosen)} seeds)")
        axis.set_title(f"{task}, {setting}", fontsize=9)
        axis.set_xlabel("RL step (0 = shared start)")
        axis.set_ylabel("held-out accuracy")
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_differences(comparisons: list[dict], path: Path) -> Path | None:
    """A forest plot of each comparison against GRPO: every seed's paired difference with its bootstrap interval
    over questions, then the two pooled intervals (over question pairs, and over seeds); None without one (GRPO
    did not run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [row for row in comparisons if row["comparison"].endswith(" - GRPO")]
    if not shown:
        return None
    figure, axes = plt.subplots(len(shown), 1, figsize=(7.5, 1.2 + 0.28 * sum(row["seeds"] + 2 for row in shown)),
                                squeeze=False, layout="constrained")
    for axis, row in zip(axes.flat, shown, strict=True):
        labels, means, lows, highs = [], [], [], []
        for seed, difference in row["per_seed"].items():
            labels.append(f"seed {seed}")
            means.append(difference["mean"]), lows.append(difference["low"]), highs.append(difference["high"])
        labels += ["pooled, over questions", "pooled, over seeds"]
        means += [row["pooled"], row["over seeds"]]
        lows += [row["CI low"], row["seeds CI low"]]
        highs += [row["CI high"], row["seeds CI high"]]
        ys = list(range(len(labels)))[::-1]
        colours = ["tab:blue"] * row["seeds"] + ["black", "tab:red"]
        for y, mean, low, high, colour in zip(ys, means, lows, highs, colours, strict=True):
            axis.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color=colour, capsize=3)
        axis.axvline(0.0, color="grey", linewidth=0.8)
        axis.set_yticks(ys, labels, fontsize=7)
        axis.set_title(f"{row['task']}, {row['setting']}: {row['comparison']} ({row['pairs']} question pairs)",
                       fontsize=9)
        axis.set_xlabel("held-out accuracy difference after RL (95% interval)", fontsize=8)
        axis.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def with_earlier_runs(runs: list[dict], reports: list[str]) -> list[dict]:
    """``runs`` and the runs of earlier reports of this benchmark (``--with-report``), to be tabulated together.

    A saved report keeps every evaluation's per-question results, so seeds run by another session (whose run
    folders are gone) pool with this invocation's. Each run keeps where it came from (``source``). Runs of another
    commit or CPU may decode otherwise, so the methods of one (task, setting, seed) pair across sources only when
    their shared step-0 evaluation gave the same answers, question by question: then they started from the same
    model, scored by the same decoder.

    Raises:
        ValueError: for a report that cannot be read, or a seed whose sources start from different step-0 answers.
    """
    combined = list(runs)
    for path in reports:
        try:
            saved = json.loads(Path(path).read_text(encoding="utf-8"))["runs"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"--with-report {path}: not a report of this benchmark ({error})") from error
        combined += [{**run, "source": run.get("source", path)} for run in saved]
    sources: dict[tuple, str] = {}
    starts: dict[tuple, list | None] = {}
    methods: set[tuple] = set()
    evaluated: dict[tuple, tuple[str, str]] = {}
    for run in combined:
        seed = (run["task"], run["setting"], run["seed"])
        where = f"{run['task']}, {run['setting']}, seed {run['seed']}"
        formats = run.setdefault("decoded", dict(EARLIER_FORMATS))
        first_format, first_source = evaluated.setdefault(seed[:2], (formats["evaluation"], run["source"]))
        if formats["evaluation"] != first_format:
            raise ValueError(f"{run['task']}, {run['setting']}: {first_source} was evaluated {first_format} and "
                             f"{run['source']} {formats['evaluation']}; accuracies of different decoders do not "
                             f"pool: rerun with --set evaluation.weight_format={first_format}, or leave one out")
        if (*seed, run["method"]) in methods:
            raise ValueError(f"{where}: {run['method']} is there twice (from {sources[seed]} and {run['source']})")
        start = (run["heldout"] or [{}])[0].get("correct")  # the shared step-0 evaluation's answers
        first_start = starts.setdefault(seed, start)
        if sources.setdefault(seed, run["source"]) != run["source"] and (start is None or start != first_start):
            comparable = start is not None and first_start is not None and len(start) == len(first_start)
            differing = (f"on {sum(a != b for a, b in zip(start, first_start, strict=True))} of {len(start)} questions"
                         if comparable else "or were not kept question by question")
            raise ValueError(f"{where}: runs come from both {sources[seed]} and {run['source']}, whose step-0 "
                             f"evaluations differ {differing}; they did not start from the same model or decoder, "
                             "so leave that seed out of one of them")
        methods.add((*seed, run["method"]))
    return combined


def splice_tables(runs: list[dict]) -> dict[str, list[dict]]:
    """Multi-hop QA, pooled over each method's runs: the randomised effect of a splice at the first tool round by
    kind and hop count, and what the policy does once a 3-hop question's second hop is seen (`_splices`)."""
    effects = [{"method": r["method"], **record} for r in runs for record in r.get("first_round_effects") or []]
    two_hops = [{"method": r["method"], **record} for r in runs for record in r.get("after_two_hops") or []]
    return {"first_round_splice_effect": pooled(effects, ("method", "kind", "hops"), "difference"),
            "after_two_hops_reward": pooled(two_hops, ("method", "reached", "then"), "reward"),
            "after_two_hops_length_cut": pooled(two_hops, ("method", "reached", "then"), "length_cut")}


def print_splice_tables(runs: list[dict], console: Any) -> None:
    from rich.table import Table

    tables = splice_tables(runs)
    for name, rows in tables.items():
        if not rows:
            continue
        table = Table(title=name.replace("_", " ") + " (multi-hop QA, pooled over runs)")
        for column in rows[0]:
            table.add_column(column)
        for row in rows:
            table.add_row(*(f"{value:+.3f}" if isinstance(value, float) else str(value) for value in row.values()))
        console.print(table)


def planned_runs(args: argparse.Namespace) -> list[tuple[str, str, int, str]]:
    """(task, setting, seed, method) of every run, interleaved by seed so that load changes spread over all."""
    runs = []
    for seed in sorted(set(args.seeds) | set(args.ablation_seeds) | set(args.no_warmup_seeds)):
        for task in args.tasks:
            for setting in args.settings:
                seeds = args.seeds if setting == "warm-up" else args.no_warmup_seeds
                for method in args.methods:
                    if method in ABLATIONS:
                        wanted = setting == "warm-up" and task in args.ablation_tasks and seed in args.ablation_seeds
                    else:
                        wanted = seed in seeds
                    if wanted:
                        runs.append((task, setting, seed, method))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="QA, 1 seed, GRPO and RAPO, 2 steps, 20 questions")
    parser.add_argument("--tasks", nargs="+", default=None, choices=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=None, choices=list(METHODS))
    parser.add_argument("--settings", nargs="+", default=None, choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds of GRPO and RAPO with the warm-up")
    parser.add_argument("--ablation-seeds", type=int, nargs="*", default=None)
    parser.add_argument("--ablation-tasks", nargs="*", default=None, choices=list(TASKS))
    parser.add_argument("--no-warmup-seeds", type=int, nargs="*", default=None)
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value", help="overrides for every run")
    parser.add_argument("--output", default="runs/learning", help="where the run folders go")
    parser.add_argument("--report-only", action="store_true",
                        help="tabulate the finished run folders under --output again, without training")
    parser.add_argument("--with-report", nargs="*", default=[], metavar="JSON",
                        help="earlier reports of this benchmark (docs/results/learning_*.json) whose runs are "
                             "tabulated and pooled with these (a seed's methods pair across them only when their "
                             "step-0 answers agree question by question)")
    args = parser.parse_args()
    if args.quick:
        defaults = {"tasks": ["qa"], "methods": ["GRPO", "RAPO"], "settings": ["warm-up"], "seeds": [0],
                    "ablation_seeds": [], "ablation_tasks": [], "no_warmup_seeds": []}
    else:
        defaults = {**PLAN, "methods": list(METHODS), "settings": list(SETTINGS)}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    overrides = (QUICK if args.quick else []) + list(args.set)
    root = Path(args.output) / ("quick" if args.quick else "full")

    started = time.time()
    runs = []
    for task, setting, seed, method in planned_runs(args):
        folder = run_folder(root, task, setting, seed, method)
        if not args.report_only:
            folder = train_method(task, setting, seed, method, overrides, root)
        if (folder / DONE).is_file():
            runs.append({**summarize(task, setting, seed, method, folder), "source": str(root)})
        else:
            print(f"not finished, left out of the tables: {folder}")
    try:
        runs = with_earlier_runs(runs, args.with_report)
    except ValueError as error:
        parser.error(str(error))
    if not runs:
        parser.error(f"no finished run of this plan under {root} (nor in --with-report): run it without "
                     "--report-only first")

    rows = []
    for task, setting in dict.fromkeys((r["task"], r["setting"]) for r in runs):
        for method in METHODS:
            chosen = [r for r in runs if (r["task"], r["setting"], r["method"]) == (task, setting, method)]
            if not chosen:
                continue
            after, half = mean_and_interval([r["heldout"][-1]["eval/accuracy"] for r in chosen])
            rows.append({
                "task": task, "setting": setting, "method": method, "seeds": len(chosen),
                "decoded": ", ".join(sorted({f"{r['decoded']['rollout']}/{r['decoded']['evaluation']}"
                                             for r in chosen})),
                "before": nanmean(r["heldout"][0]["eval/accuracy"] for r in chosen), "after": after, "±": half,
                "gain": nanmean(r["difference"]["mean"] for r in chosen if r["difference"]),
                "seeds CI>0": sum(1 for r in chosen if r["difference"] and r["difference"]["low"] > 0),
                "hybrid spliced": nanmean(r["hybrid_splice_rate"] for r in chosen),
                "skipped splices": nanmean(r["skipped_splices"] for r in chosen),
                "reward > -1": nanmean(r["rewarded_rollouts"] for r in chosen),
                "updates": nanmean(r["updates"] for r in chosen),
                "rollout s/step": nanmean(r["rollout_s_per_step"] for r in chosen),
                "update s/step": nanmean(r["update_s_per_step"] for r in chosen),
                "sampler KL": nanmean(r.get("sampler_kl_k3") for r in chosen),
                "truncated": nanmean(r.get("truncated_fraction") for r in chosen),
                "s/run": nanmean(r["seconds"] for r in chosen),
            })
    comparisons = [row for method in ("RAPO", *ABLATIONS, *VARIANTS) for row in against(runs, method, "GRPO")]
    comparisons += [row for method in ABLATIONS for row in against(runs, "RAPO", method)]
    comparisons += [row for method in VARIANTS for row in against(runs, method, "RAPO")]
    mechanism = [{"task": r["task"], "setting": r["setting"], "method": r["method"], "seed": r["seed"],
                  "hybrid spliced": r["hybrid_splice_rate"], **r["mechanism"]}
                 for r in runs if retrieves(r["method"])]
    name = "learning_quick" if args.quick else "learning"
    picture = plot(runs, RESULTS_DIR / f"{name}.png", "held-out accuracy (greedy), mean and 95% t-interval over seeds")
    forest = plot_differences(comparisons, RESULTS_DIR / f"{name}_differences.png")
    loads = [r["load_average"] for r in runs]
    report(name, "held-out accuracy after RL, from one shared start per (task, setting, seed)",
           ["task", "setting", "method", "seeds", "decoded", "before", "after", "±", "gain", "seeds CI>0",
            "hybrid spliced", "skipped splices", "reward > -1", "updates", "rollout s/step", "update s/step",
            "sampler KL", "truncated", "s/run"], rows,
           extra={"overrides": overrides, "plan": {key: getattr(args, key) for key in defaults}, "runs": runs,
                  "comparisons": comparisons, "mechanism": mechanism, "splices": splice_tables(runs),
                  "plot": str(picture),
                  "differences_plot": forest and str(forest),
                  "wall_seconds_this_invocation": time.time() - started, "load_average_per_run": loads,
                  "cpu_count": os.cpu_count(), "reported_from_existing_runs": args.report_only})
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    table = Table(title="paired differences after RL (pooled: percentile bootstrap over question pairs; over seeds: "
                        "t-interval of the per-seed differences)")
    columns = ("task", "setting", "comparison", "seeds", "pairs", "pooled", "CI low", "CI high", "over seeds",
               "seeds CI low", "seeds CI high", "per seed", "by hops")
    for column in columns:
        table.add_column(column)
    for row in comparisons:
        table.add_row(*(f"{row[c]:+.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns))
    console.print(table)
    if mechanism:  # one column per run: the metrics are many more than the runs
        keys = dict.fromkeys(key for row in mechanism for key in row if key not in ("task", "setting", "method",
                                                                                    "seed"))
        table = Table(title="mechanism, per RAPO run (means over its steps)")
        table.add_column("")
        for row in mechanism:
            table.add_column(f"{row['task']}, {row['setting']}\n{row['method']}, seed {row['seed']}")
        for key in keys:
            table.add_row(key.replace("_", " "), *(f"{row[key]:.3g}" if isinstance(row.get(key), float)
                                                   else str(row.get(key, "")) for row in mechanism))
        console.print(table)
    print_splice_tables(runs, console)
    if loads:
        print(f"load average (1 min) at the end of each run: median {statistics.median(loads):.2f} "
              f"(min {min(loads):.2f}, max {max(loads):.2f}) on {os.cpu_count()} cores")
    print(f"curves: {picture}" + (f"; differences against GRPO, per seed and pooled: {forest}" if forest else ""))


if __name__ == "__main__":
    main()
