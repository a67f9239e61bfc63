"""``rapo train``: train a policy with RAPO (or GRPO and the other baselines) from a config and overrides.

With no arguments it runs the embedded default job: SmolLM2-135M-Instruct on procedural math with
the sandboxed python tool, hybrid rollouts over the scripted-expert buffer retrieved in-process,
on CPU. Examples::

    rapo train
    rapo train retrieval.enabled=false logging.output_dir=runs/grpo      # GRPO
    rapo train --config configs/arpo.yaml                                # ARPO-style branching rollouts
    rapo train rollout.backend=ray ray.num_workers=2                     # rollouts on Ray workers
    rapo train --config configs/rapo_7b_reasoning.yaml                   # the 7B recipe, on a GPU
"""

from __future__ import annotations

import argparse

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="YAML config (default: the embedded defaults, as in configs/default.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings to override, e.g. rollout_n=8 optim.lr=1e-6 retrieval.enabled=false")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def summary_table(history: list[dict], title: str):
    """A rich table of the first, last and best values of the main metrics."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("metric", "first step", "last step", "mean of last 3"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for key, label in SUMMARY_KEYS:
        values = [record[key] for record in history if record.get(key) is not None]
        if not values:
            continue
        tail = values[-3:]
        table.add_row(label, f"{values[0]:.3f}", f"{values[-1]:.3f}", f"{sum(tail) / len(tail):.3f}")
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

    from rapo_agents.config import ConfigError, load_config

    console = Console()
    try:
        config = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as error:
        console.print(f"[red]config error:[/red] {error}")
        return 2
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")  # plain: no rich markup or wrapping
        return 0

    from rapo_agents.trainer import RAPOTrainer

    trainer = RAPOTrainer(config)
    mode = trainer.method
    console.print(f"{mode}: {trainer.total_steps} steps of {config.optim.train_batch_size} questions x "
                  f"{config.rollout.rollout_n} rollouts on {trainer.device}; run folder {trainer.output_dir}")
    result = trainer.train()
    if result.history:
        console.print(summary_table(result.history, f"{mode} on {config.data.env_id} ({result.steps} steps)"))
    if result.interrupted:
        console.print(f"interrupted: checkpoint {result.checkpoint}; run again to resume")
    console.print(f"metrics: {result.output_dir / 'metrics.jsonl'}")
    console.print(f"checkpoint: {result.checkpoint}")
    if result.plot is not None:
        console.print(f"plot: {result.plot}")
    return 130 if result.interrupted else 0
