"""``rapo eval``: evaluate a policy on any registered env; per-question JSONL, resumable, with a summary table.

Example:
    rapo eval --env RAPO-Math-v0 --limit 20 --output runs/eval_math.jsonl   # the embedded SmolLM2-135M
    rapo eval --env RAPO-Math-v0 --env-kwargs '{"dataset": "../shared/data/math/gsm8k_test.jsonl"}' --greedy
    rapo eval --policy openai --base-url http://127.0.0.1:8000/v1 --tokenizer path/to/tokenizer
    rapo eval --model runs/rapo/checkpoints/step_000010 --greedy   # on the run's own held-out settings

A checkpoint folder that ``rapo train`` wrote names its run's settings (``trainer_state.json``): without
``--env-kwargs`` and ``--max-tokens`` it is evaluated on the run's held-out questions, prompt, tool limit and
response budget, so the figures compare with the run's held-out evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from rapo_cli import checks

HELP = "Evaluate a policy on an env (math-verify accuracy for math; EM/F1 for QA and web); resumable JSONL."
EMBEDDED_MAX_TOKENS = 512
"""Default ``--max-tokens`` of the embedded SmolLM2-135M (the training default is 256)."""
SCRIPTED_NOTE = ("--policy scripted plays fixed turns (it answers \\boxed{0}): a smoke test of the pipeline whose "
                 "accuracy is 0 by design. The scripted expert that solves procedural math is "
                 "`rapo rollout --policy expert`.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rapo_agents.evaluation import EvalConfig
    from rapo_agents.policies.factory import add_policy_arguments

    defaults = EvalConfig()
    parser.add_argument("--env", default=defaults.env, help="registered env id")
    parser.add_argument("--env-kwargs", default=None,
                        help="JSON dict of gym.make keyword arguments (dataset, split, ...); default: none, or a "
                             "rapo checkpoint's held-out settings")
    add_policy_arguments(parser)
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N questions")
    parser.add_argument("--rollouts", type=int, default=1, help="rollouts per question")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"response token budget (default: {EMBEDDED_MAX_TOKENS} for the embedded SmolLM2-135M, "
                             f"{defaults.max_response_tokens} for any other model)")
    parser.add_argument("--max-tool-calls", type=int, default=None,
                        help="tool-call limit (default: 5 for python-only envs, 10 with search)")
    parser.add_argument("--metric", default="auto", choices=["auto", "math", "qa"])
    parser.add_argument("--output", default=None, help="per-question JSONL (default runs/eval_<env>.jsonl)")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of skipping rows in --output")
    parser.add_argument("--seed", type=int, default=0)


def max_tokens(args: argparse.Namespace) -> int:
    """``--max-tokens``, or the default that fits the model: the embedded 135M model rarely needs more than
    a few hundred tokens, and 4096 of them take minutes per episode on a CPU."""
    from rapo_agents.evaluation import EvalConfig
    from rapo_tools.models import is_embedded

    if args.max_tokens is not None:
        return args.max_tokens
    embedded = args.policy in ("hf", "scripted") and (args.model is None or is_embedded(args.model))
    return EMBEDDED_MAX_TOKENS if embedded else EvalConfig().max_response_tokens


def check_arguments(args: argparse.Namespace) -> dict:
    """Every option checked before a model loads; returns ``--env-kwargs`` as a dict."""
    checks.env_id(args.env)
    env_kwargs = checks.env_kwargs(args.env_kwargs or "{}")
    checks.policy(args)
    for name in ("limit", "rollouts", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise checks.UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    checks.output_file(args.output or default_output(args.env), "--output")
    return env_kwargs


def trained_settings(model: str | None, env: str) -> dict[str, Any] | None:
    """The held-out evaluation settings of the rapo run that wrote checkpoint folder ``model``, as `EvalConfig`
    fields: its ``gym.make`` keyword arguments, response budget and per-turn budget. None for any other model, or a
    checkpoint trained on another env."""
    from rapo_agents.checkpoint import trained_config
    from rapo_agents.heldout import heldout_env_kwargs
    from rapo_agents.trainer import training_env_kwargs

    config = trained_config(model) if model else None
    if config is None or config.data.env_id != env:
        return None
    return {"env_kwargs": heldout_env_kwargs(training_env_kwargs(config), config.evaluation),
            "max_response_tokens": config.evaluation.max_eval_tokens or config.rollout.max_response_tokens,
            "max_turn_tokens": config.rollout.max_turn_tokens}


def default_output(env: str) -> str:
    return f"runs/eval_{env}.jsonl"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rapo_agents.evaluation import EvalConfig, evaluate
    from rapo_agents.policies.factory import policy_from_args

    env_kwargs = check_arguments(args)
    console = Console()
    if args.policy == "scripted":
        console.print(SCRIPTED_NOTE)
    config = EvalConfig(
        env=args.env, env_kwargs=env_kwargs, limit=args.limit, rollouts=args.rollouts,
        temperature=0.0 if args.greedy else args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_response_tokens=max_tokens(args), max_tool_calls=args.max_tool_calls, metric=args.metric,
        output=args.output or default_output(args.env), resume=not args.no_resume, seed=args.seed,
    )
    trained = trained_settings(args.model, args.env) if args.env_kwargs is None else None
    if trained is not None:
        if args.max_tokens is not None:
            trained.update(max_response_tokens=args.max_tokens, max_turn_tokens=None)
        config = dataclasses.replace(config, **trained)
        console.print(f"{args.model} was written by `rapo train`: evaluating on its run's held-out settings "
                      f"{json.dumps(config.env_kwargs)}, {config.max_response_tokens} response tokens "
                      f"({config.max_turn_tokens} a turn); --env-kwargs and --max-tokens replace them")
    report = evaluate(policy_from_args(args), config)
    summary = report.summary
    policy = "scripted: fixed turns, a smoke test" if args.policy == "scripted" else args.policy
    table = Table(title=f"{config.env}: {summary['n']} rollouts ({policy}, metric {summary['metric']})")
    columns = [k for k in ("accuracy", "em", "f1", "mean_reward", "mean_tool_calls", "mean_tokens") if k in summary]
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(*(f"{summary[c]:.3f}" if c in ("accuracy", "em", "f1", "mean_reward") else f"{summary[c]:.1f}"
                    for c in columns))
    console.print(table)
    console.print(f"rows written to {config.output}")
    return 0
