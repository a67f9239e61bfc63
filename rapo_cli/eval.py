"""``rapo eval``: evaluate a policy on any registered env; per-question JSONL, resumable, with a summary table.

Example:
    rapo eval --env RAPO-Math-v0 --limit 20 --output runs/eval_math.jsonl   # the embedded SmolLM2-135M
    rapo eval --env RAPO-Math-v0 --env-kwargs '{"dataset": "../shared/data/math/gsm8k_test.jsonl"}' --greedy
    rapo eval --policy openai --base-url http://127.0.0.1:8000/v1 --tokenizer path/to/tokenizer
    rapo eval --model runs/rapo/checkpoints/step_000010 --greedy   # on the run's own held-out settings

A checkpoint folder that ``rapo train`` wrote names its run's settings (``trainer_state.json``): without
``--env-kwargs`` and ``--max-tokens`` it is evaluated on the run's held-out questions, prompt, tool limit and
response budget, so the figures compare with the run's held-out evaluation. Only the settings in
`CHECKPOINT_ENV_SETTINGS` carry over: a checkpoint is data someone else may have written, so nothing that
decides how the model's code runs (``sandbox``, ``python``, search endpoints, judges) is ever taken from it.

The output file records what produced its rows; a resume with another model, env, split or decoding is refused
(exit 2) with what differs. The default file name carries a digest of those settings, so two evaluations never
share it. The hub is offline (``HF_HUB_OFFLINE=1``, as for ``rapo train``) unless the variable says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub, which reads it once

from rapo_cli import checks  # noqa: E402

HELP = "Evaluate a policy on an env (math-verify accuracy for math; EM/F1 for QA and web); resumable JSONL."
EMBEDDED_MAX_TOKENS = 512
"""Default ``--max-tokens`` of the embedded SmolLM2-135M (the training default is 256)."""
CHECKPOINT_ENV_SETTINGS = frozenset({
    "dataset", "split", "num_tasks", "difficulty", "limit", "ability", "level", "lang", "seed", "system_prompt",
    "prompt_template", "max_tool_calls", "max_turns", "max_text_length", "knowledge_base",
})
"""The ``gym.make`` arguments that a checkpoint's run settings may give ``rapo eval``: questions (a generated knowledge
base's sizes too), prompt, tool limit and budgets. Everything else (``sandbox``, ``python``, ``browse``, ``judge``,
``reward``, paths of services or caches, and ``search`` but for `CHECKPOINT_SEARCH_SETTINGS`) is left at the env's
default."""
CHECKPOINT_SEARCH_SETTINGS = frozenset({"topk"})
"""The ``search`` settings a checkpoint may give: how many passages a search shows (what the model was trained to
read), never where or how the search service is reached."""
SCRIPTED_NOTE = ("--policy scripted plays fixed turns (it answers \\boxed{0}): a smoke test of the pipeline whose "
                 "accuracy is 0 by design. The scripted expert that solves procedural math is "
                 "`rapo rollout --policy expert`.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rapo_agents.evaluation import EvalConfig
    from rapo_agents.heldout import HeldoutConfig
    from rapo_agents.policies.factory import add_policy_arguments
    from rapo_agents.policies.llama_decoder import WEIGHT_FORMATS

    defaults = EvalConfig()
    parser.add_argument("--env", default=defaults.env, help="registered env id")
    parser.add_argument("--env-kwargs", default=None,
                        help="JSON dict of gym.make keyword arguments (dataset, split, ...); default: none, or a "
                             "rapo checkpoint's held-out settings")
    add_policy_arguments(parser)
    parser.add_argument("--weight-format", default=HeldoutConfig.weight_format, choices=WEIGHT_FORMATS,
                        help="hf fast engine: fp32 (exact, the answers of `rapo train`'s held-out evaluation), int8 "
                             "or bf16 (faster on CPU; greedy answers can differ where they hang on a near tie)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N questions")
    parser.add_argument("--rollouts", type=int, default=1, help="rollouts per question")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    parser.add_argument("--temperature", type=float, default=defaults.rollout.temperature)
    parser.add_argument("--top-p", type=float, default=defaults.rollout.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.rollout.top_k)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"response token budget (default: {EMBEDDED_MAX_TOKENS} for the embedded SmolLM2-135M, "
                             f"{defaults.rollout.max_response_tokens} for any other model)")
    parser.add_argument("--max-tool-calls", type=int, default=None,
                        help="tool-call limit (default: 5 for python-only envs, 10 with search)")
    parser.add_argument("--metric", default="auto", choices=["auto", "math", "qa"])
    parser.add_argument("--output", default=None,
                        help="per-question JSONL (default runs/eval_<env>_<digest of model, env settings and "
                             "decoding>.jsonl); resumed only by the same settings")
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
    return EMBEDDED_MAX_TOKENS if embedded else EvalConfig().rollout.max_response_tokens


def check_arguments(args: argparse.Namespace) -> dict:
    """Every option checked before a model loads; returns ``--env-kwargs`` as a dict."""
    checks.env_id(args.env)
    env_kwargs = checks.env_kwargs(args.env_kwargs or "{}", env=args.env)
    checks.policy(args)
    for name in ("limit", "rollouts", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise checks.UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.output is not None:
        checks.output_file(args.output, "--output")
    return env_kwargs


def trained_settings(model: str | None, env: str) -> dict[str, Any] | None:
    """The held-out evaluation settings of the rapo run that wrote checkpoint folder ``model``: its ``gym.make``
    keyword arguments (``env_kwargs``, only `CHECKPOINT_ENV_SETTINGS`), under ``"budgets"`` its response and
    per-turn budgets (`RolloutConfig` fields), and under ``"ignored"`` the names of the env settings it left out.
    None for any other model, or a checkpoint trained on another env."""
    from rapo_agents.checkpoint import trained_config
    from rapo_agents.heldout import heldout_env_kwargs
    from rapo_agents.trainer import training_env_kwargs

    config = trained_config(model) if model else None
    if config is None or config.data.env_id != env:
        return None
    run_kwargs = heldout_env_kwargs(training_env_kwargs(config), config.evaluation)
    env_kwargs = {k: v for k, v in run_kwargs.items() if k in CHECKPOINT_ENV_SETTINGS}
    search = run_kwargs.get("search")
    shown = {k: v for k, v in search.items() if k in CHECKPOINT_SEARCH_SETTINGS} if isinstance(search, dict) else {}
    if shown:
        env_kwargs["search"] = shown
    return {"env_kwargs": env_kwargs,
            "ignored": sorted(k for k in run_kwargs if k not in CHECKPOINT_ENV_SETTINGS
                              and not (k == "search" and shown == search)),
            "budgets": {"max_response_tokens": config.evaluation.max_eval_tokens or config.rollout.max_response_tokens,
                        "max_turn_tokens": config.rollout.max_turn_tokens}}


def default_output(config: Any) -> str:
    """``runs/eval_<env>_<digest>.jsonl``: the digest names the model, env settings and decoding."""
    from rapo_agents.evaluation import settings_digest

    return f"runs/eval_{config.env}_{settings_digest(config)}.jsonl"


def check_resume(config: Any) -> None:
    """Refuse (`UsageError`) to resume into a file of another evaluation, before the model loads."""
    from rapo_agents.evaluation import EvalOutputMismatchError
    from rapo_agents.evaluation import check_resume as check

    if not config.resume:
        return
    try:
        check(config.output, config)
    except EvalOutputMismatchError as error:
        message = str(error).replace("start over (resume off) or write to another output file",
                                     "pass --no-resume to overwrite it, or another --output")
        raise checks.UsageError(f"--output: {message}") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rapo_agents.evaluation import EVAL_ROLLOUT, EvalConfig, evaluate
    from rapo_agents.policies.factory import policy_from_args

    env_kwargs = check_arguments(args)
    console = Console()
    if args.policy == "scripted":
        console.print(SCRIPTED_NOTE)
    rollout = dataclasses.replace(EVAL_ROLLOUT, rollout_n=args.rollouts, top_p=args.top_p, top_k=args.top_k,
                                  temperature=0.0 if args.greedy else args.temperature,
                                  max_response_tokens=max_tokens(args))
    config = EvalConfig(
        env=args.env, env_kwargs=env_kwargs, limit=args.limit, rollout=rollout, max_tool_calls=args.max_tool_calls,
        metric=args.metric, output=args.output, resume=not args.no_resume, seed=args.seed, model=model_label(args),
    )
    trained = trained_settings(args.model, args.env) if args.env_kwargs is None else None
    if trained is not None:
        ignored, budgets = trained.pop("ignored"), trained.pop("budgets")
        if args.max_tokens is not None:
            budgets.update(max_response_tokens=args.max_tokens, max_turn_tokens=None)
        config = dataclasses.replace(config, **trained, rollout=dataclasses.replace(config.rollout, **budgets))
        console.print(f"{args.model} was written by `rapo train`: evaluating on its run's held-out settings "
                      f"{json.dumps(config.env_kwargs)}, {config.rollout.max_response_tokens} response tokens "
                      f"({config.rollout.max_turn_tokens} a turn), taken from the checkpoint; --env-kwargs and "
                      "--max-tokens replace them", markup=False, highlight=False, soft_wrap=True)
        if ignored:
            console.print(f"not taken from the checkpoint (code execution, services and rewards are never set by "
                          f"a checkpoint; the env's defaults apply): {', '.join(ignored)}", markup=False,
                          highlight=False, soft_wrap=True)
    if config.output is None:
        config = dataclasses.replace(config, output=default_output(config))
        checks.output_file(config.output, "--output")
    check_resume(config)
    report = evaluate(policy_from_args(args), config)
    summary = report.summary
    if summary["n"] == 0 and summary.get("failed"):
        print(f"rapo eval: every generation failed ({summary['failed']} rollouts), nothing was scored: "
              f"{summary.get('first_error')}; rows in {config.output}", file=sys.stderr)
        return 1
    policy = "scripted: fixed turns, a smoke test" if args.policy == "scripted" else args.policy
    table = Table(title=f"{config.env}: {summary['n']} rollouts ({policy}, metric {summary['metric']})")
    columns = [k for k in ("accuracy", "em", "f1", "mean_reward", "mean_tool_calls", "mean_tokens") if k in summary]
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(*(f"{summary[c]:.3f}" if c in ("accuracy", "em", "f1", "mean_reward") else f"{summary[c]:.1f}"
                    for c in columns))
    console.print(table)
    console.print(f"rows written to {config.output}")
    if summary.get("failed"):
        console.print(f"{summary['failed']} rollouts failed to generate and are not in the table (not scored as "
                      f"wrong): {summary.get('first_error')}; run the same command again to retry them",
                      markup=False, highlight=False, soft_wrap=True)
        return 1
    return 0


def model_label(args: argparse.Namespace) -> str:
    """What ``--policy``/``--model`` evaluate and (hf) how they decode, as the output file records it."""
    if args.policy == "openai":
        return f"openai:{args.base_url}:{args.model or ''}"
    if args.policy == "scripted":
        return "scripted"
    decoder = f" (hf engine {args.hf_engine}, weight format {args.weight_format})"
    if args.model is None:
        return "embedded" + decoder
    from pathlib import Path

    folder = Path(args.model).expanduser()
    return (str(folder.resolve()) if folder.exists() else args.model) + decoder
