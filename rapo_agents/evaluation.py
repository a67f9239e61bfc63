"""Evaluation of a policy over any registered env: per-question JSONL, resumable, with a summary table.

The defaults mirror the reference evaluation: temperature 0.6, top-p 0.95, top-k 20, at most
4,096 response tokens, up to 5 python calls (math) and 10 search calls (QA and web).
Metrics are computed on the policy's final answer (the ``\\boxed{}`` of its ``<answer>``):
accuracy by math-verify for math; exact match and token F1 (SQuAD normalisation, best over
the gold aliases) for QA and web. Every rollout is one JSONL row, appended as soon as it
ends, so an interrupted run resumes where it stopped.

The file's first line records what produced its rows (`eval_settings`: model, env, env keyword arguments,
split, decoding); a resume with other settings raises `EvalOutputMismatchError`, naming what differs,
instead of mixing rows of two evaluations. A rollout whose generation failed (``policy_error``: a dead
endpoint, an out-of-memory error) is written with ``"failed": true``, counted apart (``summary["failed"]``),
never scored as a wrong answer, and played again by the next resume.

Example:
    >>> from rapo_agents.policies import ScriptedPolicy
    >>> import tempfile, os
    >>> policy = ScriptedPolicy(["<python>\\nprint(1)\\n</python>", "<answer>\\\\boxed{1}</answer>"])
    >>> out = os.path.join(tempfile.mkdtemp(), "eval.jsonl")
    >>> report = evaluate(policy, EvalConfig(env_kwargs={"num_tasks": 2, "sandbox": "subprocess"},
    ...                                      limit=2, output=out, show_progress=False))
    >>> report.summary["n"], report.summary["mean_tool_calls"]
    (2, 1.0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_agents.policies.base import Policy
from rapo_agents.rollout.engine import RolloutConfig, RolloutEngine, make_env_factory
from rapo_env.rewards.equivalence import answers_equivalent
from rapo_env.rewards.text import best_over_aliases, exact_match, final_answer, token_f1
from rapo_env.trajectory import Trajectory
from rapo_tools.jsonl import read_jsonl, write_jsonl

DEFAULT_TOOL_CALLS = {"python": 5, "search": 10}
"""The reference evaluation's tool-call limits per tool."""

SETTINGS_KEY = "rapo_eval_settings"
"""Key of the header line that records what produced an eval file's rows."""

EVAL_ROLLOUT = RolloutConfig(rollout_n=1, temperature=0.6, top_p=0.95, top_k=20, max_prompt_tokens=2048,
                             max_response_tokens=4096, max_turn_tokens=None)
"""The reference evaluation's decoding: one rollout per question, temperature 0.6, top-p 0.95, top-k 20, 4,096
response tokens, no per-turn limit."""

FAILED_END_REASONS = frozenset({"policy_error"})
"""End reasons of rollouts whose generation failed: counted apart, not scored, redone on resume."""


class EvalOutputMismatchError(ValueError):
    """An eval output file holds rows of another evaluation (another model, env, split or decoding)."""


@dataclasses.dataclass
class EvalConfig:
    """What to evaluate and how."""

    env: str = "RAPO-Math-v0"
    """Registered env id."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``gym.make`` keyword arguments (``dataset``, ``split``, ...)."""
    limit: int | None = None
    """Evaluate the first ``limit`` questions (None: all)."""
    rollout: RolloutConfig = dataclasses.field(default_factory=lambda: dataclasses.replace(EVAL_ROLLOUT))
    """How the rollouts are generated (default `EVAL_ROLLOUT`, the reference's decoding): ``rollout_n`` rollouts
    per question (rows carry ``rollout_index``), sampling, and the prompt, response and per-turn budgets."""
    max_tool_calls: int | None = None
    """Tool-call limit; None: 5 for python-only envs, 10 for envs with search (the reference's)."""
    metric: str = "auto"
    """``math`` (math-verify accuracy), ``qa`` (EM and F1) or ``auto`` (math when the env's only tool is python)."""
    output: str | None = None
    """Per-question JSONL; rows already there are kept and skipped (resume) when they were produced by the same
    settings (`eval_settings`)."""
    model: str | None = None
    """What is evaluated (a model folder, hub id or served model name), recorded in ``output``'s header so that a
    resume never mixes the rows of two models."""
    resume: bool = True
    """Skip questions whose rows are already in ``output``."""
    chunk_size: int = 16
    """Questions per engine run (rows are written as each rollout ends)."""
    seed: int = 0
    """Seed of sampling and env resets."""
    show_progress: bool = True
    """Show a progress bar."""


@dataclasses.dataclass
class EvalReport:
    """Rows (one per rollout) and their summary."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def eval_settings(config: EvalConfig) -> dict[str, Any]:
    """What produced an eval file's rows: a resume must match them exactly.

    Example:
        >>> eval_settings(EvalConfig(model="m", env_kwargs={"split": "test"}))["split"]
        'test'
    """
    rollout = config.rollout
    return {
        "model": config.model, "env": config.env, "env_kwargs": config.env_kwargs,
        "split": config.env_kwargs.get("split"), "metric": config.metric, "max_tool_calls": config.max_tool_calls,
        "decoding": {"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k,
                     "max_response_tokens": rollout.max_response_tokens, "max_turn_tokens": rollout.max_turn_tokens,
                     "max_prompt_tokens": rollout.max_prompt_tokens, "seed": config.seed},
    }


def settings_digest(config: EvalConfig) -> str:
    """Eight hex digits that name `eval_settings` (default output file names carry them).

    Example:
        >>> settings_digest(EvalConfig()) == settings_digest(EvalConfig(limit=3))  # the limit is not a setting
        True
    """
    text = json.dumps(eval_settings(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def settings_mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``name: recorded -> current`` for each setting that differs (decoding settings one by one)."""
    def flat(settings: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in settings.items() if k != "decoding"}, **dict(settings.get("decoding") or {})}

    old, new = flat(json.loads(json.dumps(recorded, default=str))), flat(json.loads(json.dumps(current, default=str)))
    return [f"{key}: {old.get(key)!r} in the file, {new.get(key)!r} now"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]


def read_settings(path: str | Path) -> dict[str, Any] | None:
    """The settings recorded on the first line of an eval file (None: no file, or no header line)."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        first = handle.readline()
    try:
        value = json.loads(first)
    except json.JSONDecodeError:
        return None
    return value.get(SETTINGS_KEY) if isinstance(value, dict) else None


def check_resume(path: str | Path, config: EvalConfig) -> None:
    """Raise `EvalOutputMismatchError` unless the eval file ``path`` was written with ``config``'s settings (or
    holds no rows)."""
    path = Path(path)
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        return
    recorded = read_settings(path)
    if recorded is None:
        raise EvalOutputMismatchError(
            f"{path} holds eval rows that do not record what produced them (an older rapo wrote it), so they "
            "cannot be resumed safely: start over (resume off) or write to another output file")
    differences = settings_mismatch(recorded, eval_settings(config))
    if differences:
        raise EvalOutputMismatchError(
            f"{path} holds rows of another evaluation ({'; '.join(differences)}): start over (resume off) or write "
            "to another output file")


def is_failed(row: dict[str, Any]) -> bool:
    """Whether a row records a failed generation (not an answer)."""
    return bool(row.get("failed")) or row.get("end_reason") in FAILED_END_REASONS


def score_answer(prediction: str | None, answers: Sequence[str], metric: str) -> dict[str, float]:
    """Metrics of one final answer: ``accuracy`` (math) or ``em`` and ``f1`` (qa)."""
    prediction = prediction or ""
    if metric == "math":
        return {"accuracy": float(bool(prediction) and any(answers_equivalent(prediction, g) for g in answers))}
    if metric == "qa":
        return {"em": best_over_aliases(exact_match, prediction, answers),
                "f1": best_over_aliases(token_f1, prediction, answers)}
    raise ValueError(f"metric must be 'math' or 'qa', not {metric!r}")


def row_of(trajectory: Trajectory, answers: Sequence[str], metric: str) -> dict[str, Any]:
    """The JSONL row of one evaluated rollout."""
    prediction = final_answer(trajectory.response)
    response_tokens = len(trajectory.token_ids or []) - (trajectory.prompt_length or 0)
    if trajectory.end_reason in FAILED_END_REASONS:  # no answer to score: the generation itself failed
        return {"task_id": trajectory.task_id, "task_index": trajectory.extra.get("task_index"),
                "rollout_index": trajectory.rollout_index, "question": trajectory.question, "failed": True,
                "end_reason": trajectory.end_reason, "error": trajectory.extra.get("error")}
    return {
        "task_id": trajectory.task_id,
        "task_index": trajectory.extra.get("task_index"),
        "rollout_index": trajectory.rollout_index,
        "question": trajectory.question,
        "answers": list(answers),
        "prediction": prediction,
        **score_answer(prediction, answers, metric),
        "reward": trajectory.reward,
        "format_ok": trajectory.metrics.get("format_ok"),
        "num_tool_calls": trajectory.num_tool_calls,
        "response_tokens": response_tokens,
        "end_reason": trajectory.end_reason,
        "response": trajectory.response,
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over the scored rows: the metrics present, reward, tool calls and response tokens; ``failed`` counts
    the rows whose generation failed (left out of every mean)."""
    failed = [row for row in rows if is_failed(row)]
    rows = [row for row in rows if not is_failed(row)]
    summary: dict[str, Any] = {"n": len(rows), "failed": len(failed)}
    if failed:
        summary["first_error"] = failed[0].get("error")
    for key in ("accuracy", "em", "f1", "reward", "num_tool_calls", "response_tokens"):
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
        if values:
            name = {"num_tool_calls": "mean_tool_calls", "response_tokens": "mean_tokens",
                    "reward": "mean_reward"}.get(key, key)
            summary[name] = sum(values) / len(values)
    return summary


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of an eval JSONL ([] when there is none), without its settings header; unreadable lines are skipped
    with a warning."""
    if not Path(path).is_file():
        return []
    return [row for row in read_jsonl(path, _eval_row, what="eval rows") if SETTINGS_KEY not in row]


def _eval_row(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and (SETTINGS_KEY in value or ("task_index" in value and "rollout_index" in value)):
        return value
    raise ValueError("not an eval row (no task_index and rollout_index)")


def _env_kwargs_with_limits(config: EvalConfig, tools: Sequence[str]) -> dict[str, Any]:
    kwargs = dict(config.env_kwargs)
    if "max_tool_calls" not in kwargs:
        reference_limit = max(DEFAULT_TOOL_CALLS.get(tag, 5) for tag in tools or ["python"])
        kwargs["max_tool_calls"] = config.max_tool_calls or reference_limit
    return kwargs


def evaluate(policy: Policy, config: EvalConfig) -> EvalReport:
    """Run ``config.rollout.rollout_n`` rollouts of each question and score them; resumes from ``config.output``."""
    from tqdm.auto import tqdm

    output = Path(config.output) if config.output else None
    rows: list[dict[str, Any]] = []
    if output is not None and config.resume and output.is_file():
        check_resume(output, config)
        found = read_rows(output)
        rows = [row for row in found if not is_failed(row)]
        print(f"resuming {output}: kept {len(rows)} row{'' if len(rows) == 1 else 's'} of the same model, env, split "
              "and decoding"
              + (f", dropped {len(found) - len(rows)} failed generations (played again)" if len(found) > len(rows)
                 else ""))
    if output is not None and (not config.resume or not read_settings(output)):
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps({SETTINGS_KEY: eval_settings(config)}, default=str) + "\n", encoding="utf-8")
    probe = make_env_factory(config.env, config.env_kwargs)()
    try:
        tools = list(getattr(probe.unwrapped, "tool_tags", ()))
    finally:
        probe.close()
    metric = config.metric if config.metric != "auto" else ("math" if tools == ["python"] else "qa")
    engine = RolloutEngine(config.env, policy, config.rollout, env_kwargs=_env_kwargs_with_limits(config, tools))
    rollouts = config.rollout.rollout_n
    done = {(row["task_index"], row["rollout_index"]) for row in rows}
    try:
        tasks = engine.tasks
        count = len(tasks) if config.limit is None else min(config.limit, len(tasks))
        todo = [q for q in range(count) if any((q, i) not in done for i in range(rollouts))]
        bar = tqdm(total=count * rollouts, initial=(count - len(todo)) * rollouts,
                   desc=f"eval {config.env}", unit="rollout", disable=not config.show_progress)

        def record(trajectory: Trajectory) -> None:
            if (trajectory.extra["task_index"], trajectory.rollout_index) in done:
                return  # a rollout of a half-finished question that an earlier run already wrote
            row = row_of(trajectory, tasks[trajectory.extra["task_index"]].answers, metric)
            rows.append(row)
            if output is not None:
                write_jsonl(output, [row], append=True)
            bar.update(1)
            throughput = getattr(policy, "throughput", None)  # HFPolicy / FastPolicy count generated tokens
            if throughput is not None:
                bar.set_postfix_str(f"{throughput.tokens_per_s:.1f} tok/s", refresh=False)

        for start in range(0, len(todo), config.chunk_size):
            engine.run(todo[start : start + config.chunk_size], seed=config.seed, on_trajectory=record)
        bar.close()
    finally:
        engine.close()
    rows = sorted((r for r in rows if r["task_index"] < count),
                  key=lambda r: (r["task_index"], r["rollout_index"]))
    rows = list({(r["task_index"], r["rollout_index"]): r for r in rows}.values())
    summary = {"env": config.env, "metric": metric, **summarize(rows)}
    return EvalReport(rows=rows, summary=summary)
