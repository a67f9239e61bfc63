"""``rapo train``: train a policy with RAPO (or GRPO and the other baselines) from a config and overrides.

With no arguments it runs the embedded default job: SmolLM2-135M-Instruct on procedural math with
the sandboxed python tool, hybrid rollouts over the scripted-expert buffer retrieved in-process,
on CPU. ``rapo train --help`` lists every setting. Examples::

    rapo train
    rapo train retrieval.enabled=false logging.output_dir=runs/grpo      # GRPO
    rapo train --config configs/arpo.yaml                                # ARPO-style branching rollouts
    rapo train rollout.backend=ray ray.num_workers=2                     # rollouts on Ray workers
    rapo train --config configs/rapo_7b_reasoning.yaml                   # the 7B recipe, on a GPU
"""

from __future__ import annotations

import argparse

from rapo_cli import checks

HELP = "Train a policy with RAPO; no arguments = the embedded CPU default (SmolLM2-135M, procedural math)."

SUMMARY_KEYS = (
    ("reward/mean", "reward"),
    ("accuracy", "accuracy"),
    ("format_rate", "format rate"),
    ("tool_calls/mean", "tool calls"),
    ("response_tokens/mean", "response tokens"),
    ("retrieval/count_mean", "retrievals / rollout"),
    ("retrieval/z_ret_mean", "Z_ret (hybrid)"),
    ("rollout/branches", "ARPO branches / step"),
    ("loss/clip_fraction", "clip fraction"),
    ("optim/grad_norm", "grad norm"),
    ("time/step_s", "seconds / step"),
)


SETTINGS_INTRO = """settings (key=value; a key's last part alone works when it is unique, e.g. rollout_n=8;
values are YAML; TRL/verl names such as learning_rate or actor_rollout_ref.rollout.n are accepted too):"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rapo_agents.config import TrainConfig
    from rapo_cli.settings_help import render

    examples = __doc__.split("Examples::", 1)[1].rstrip()
    parser.epilog = f"examples:{examples}\n\n{SETTINGS_INTRO}\n\n{render(TrainConfig)}"
    parser.add_argument("--config", default=None,
                        help="YAML config (default: the embedded defaults, as in configs/default.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings to override, e.g. rollout_n=8 optim.lr=1e-6 retrieval.enabled=false")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


SUMMARY_FILE = "summary.txt"
"""The run's console summary (the tables `rapo train` prints at the end), kept in the run folder."""


def summary_table(history: list[dict], title: str, questions: int | None = None, rollouts: int | None = None):
    """A rich table of the main training metrics: the moving mean of the first and of the last
    `SMOOTHING_STEPS` steps, and the last step's value. One step's training reward is a mean over ``questions``
    x ``rollouts`` episodes only, so a single step says little (the caption says so)."""
    from rich.table import Table

    from rapo_agents.metrics import SMOOTHING_STEPS

    window = SMOOTHING_STEPS
    table = Table(title=title)
    for column in ("metric", f"first {window} steps (mean)", f"last {window} steps (mean)", "last step"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for key, label in SUMMARY_KEYS:
        values = [record[key] for record in history if record.get(key) is not None]
        if not values:
            continue
        head, tail = values[:window], values[-window:]
        table.add_row(label, f"{sum(head) / len(head):.3f}", f"{sum(tail) / len(tail):.3f}", f"{values[-1]:.3f}")
    if questions is not None:
        per_step = f"{questions} questions x {rollouts} rollouts" if rollouts else f"{questions} questions"
        table.caption = (f"training metrics are over {per_step} per step, so one step's value is noisy: means of "
                         f"{window} steps; the held-out table measures the policy")
    return table


def heldout_table(result):
    """A rich table of held-out accuracy: warm-up only (before RL) against after RL, with CIs and the difference."""
    from rich.table import Table

    before, after = result.heldout[0], result.heldout[-1]
    table = Table(title=f"held-out accuracy: {len(after.correct)} test questions, greedy, 95% bootstrap CI")
    for column in ("policy", "accuracy [95% CI]", "format", "tool calls", "reward"):
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)

    def row(label, evaluation):
        metrics = evaluation.metrics
        table.add_row(label, f"{metrics['eval/accuracy']:.3f} [{metrics['eval/accuracy_ci_low']:.3f}, "
                             f"{metrics['eval/accuracy_ci_high']:.3f}]",
                      f"{metrics['eval/format_rate']:.2f}", f"{metrics['eval/tool_calls']:.2f}",
                      f"{metrics['eval/reward']:.3f}")

    row("warm-up only", before)
    row(f"after RL (step {after.step})", after)
    for key in sorted(key for key in after.metrics if key.startswith("eval/accuracy_hops")):
        hops = key.removeprefix("eval/accuracy_hops")
        table.add_row(f"  {hops}-hop questions", f"{before.metrics.get(key, float('nan')):.3f} -> "
                                                 f"{after.metrics[key]:.3f}", "", "", "")
    difference = result.heldout_difference
    if difference is not None:
        verdict = "above 0" if difference.low > 0 else "includes 0" if difference.high >= 0 else "below 0"
        table.add_row("difference", f"{difference.mean:+.3f} [{difference.low:+.3f}, {difference.high:+.3f}]", "", "",
                      "")
        table.caption = f"difference: after RL minus warm-up only, paired over the same questions; its CI {verdict}"
    return table


def profile_table(profile: dict[str, float]):
    """A rich table of the seconds spent per phase of the run."""
    from rich.table import Table

    table = Table(title="where the time went (this process)")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    # rollout contains generate and tools (they overlap): the total counts rollout once.
    total = sum(seconds for phase, seconds in profile.items() if phase not in ("generate", "tools")) or 1.0
    for phase, seconds in profile.items():
        label = f"  {phase} (in rollout)" if phase in ("generate", "tools") else phase
        table.add_row(label, f"{seconds:.1f}", f"{seconds / total:.0%}")
    table.add_row("total", f"{total:.1f}", "")
    return table


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Idle OpenMP threads sleep instead of spinning: on a busy CPU (tool subprocesses, other jobs) spinning
    # threads slowed generation ten-fold in our measurements. It must be set before torch loads OpenMP.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import yaml
    from rich.console import Console

    from rapo_agents.config_loader import check_config, load_config

    console = Console(record=True)  # what it prints is also kept as the run folder's summary.txt
    if args.config is not None:
        checks.existing_file(args.config, "--config", "give a YAML config such as configs/grpo.yaml")
    config = load_config(args.config, args.overrides)
    check_config(config)  # files, env id, model and choices, before the model loads
    for setting in ("data.env_kwargs", "evaluation.heldout_env_kwargs"):
        section, _, name = setting.partition(".")
        checks.known_env_arguments(getattr(getattr(config, section), name), config.data.env_id, setting)
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")  # plain: no rich markup or wrapping
        return 0

    from rapo_agents.run_control import RunFolderLock
    from rapo_agents.trainer import RAPOTrainer

    # Refused in a second, before the model loads, when another run uses the folder; held until the process ends.
    lock = RunFolderLock(config.logging.output_dir).__enter__()  # noqa: F841
    trainer = RAPOTrainer(config)
    mode = trainer.method
    console.print(f"{mode}: {trainer.total_steps} steps of {config.optim.train_batch_size} questions x "
                  f"{config.rollout.rollout_n} rollouts on {trainer.device}; run folder {trainer.output_dir}")
    result = trainer.train()
    if result.already_complete:
        console.print(f"{trainer.output_dir} is already complete at step {result.steps} (checkpoint "
                      f"{result.checkpoint}). Start a new run with logging.output_dir=<new folder>, or train this "
                      f"folder again from scratch with logging.resume=false.")
        return 0
    if result.history:
        console.print(summary_table(result.history, f"{mode} on {config.data.env_id} ({result.steps} steps)",
                                    config.optim.train_batch_size, config.rollout.rollout_n))
    if len(result.heldout) >= 2:
        console.print(heldout_table(result))
    if result.profile:
        console.print(profile_table(result.profile))
    if result.interrupted:
        console.print(f"interrupted: checkpoint {result.checkpoint}; run again to resume")
    console.print(f"metrics: {result.output_dir / 'metrics.jsonl'}")
    console.print(f"checkpoint: {result.checkpoint}")
    if result.plot is not None:
        console.print(f"plot: {result.plot}")
    console.print(f"summary: {result.output_dir / SUMMARY_FILE}")
    console.save_text(str(result.output_dir / SUMMARY_FILE))
    return 130 if result.interrupted else 0
