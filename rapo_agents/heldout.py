"""Held-out evaluation inside training: greedy rollouts of a fixed split, through the training engine and policy.

The held-out split is the training task's ``test`` split. For the embedded procedural math it comes from
another generator seed than the ``train`` split, so it shares no question with the training questions, nor
with the warm-up's expert episodes (which are training questions). Evaluation builds a `RolloutEngine` over
the same env id and the same policy object as training, with the rollout settings of training except that
decoding is greedy, there is one rollout per question and no retrieval wrapper: it measures the policy
alone, as a user of the trained model would run it.

Accuracy comes with a percentile-bootstrap confidence interval; two evaluations of the same questions
(before and after RL) are compared by a paired bootstrap of their difference.

Example:
    >>> low, high = bootstrap_ci([1.0] * 30 + [0.0] * 70, confidence=0.95, resamples=2000, seed=0)
    >>> round(low, 2) < 0.3 < round(high, 2)
    True
    >>> difference = paired_difference([0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], resamples=1000)
    >>> difference.mean
    0.5
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rapo_agents.metrics import read_metrics
from rapo_agents.policies.fast import FastPolicy
from rapo_agents.policies.llama_decoder import WEIGHT_FORMATS
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.engine import RolloutEngine
from rapo_agents.run_control import RunControl
from rapo_env.trajectory import Trajectory

if TYPE_CHECKING:
    from rapo_agents.config import TrainConfig


@dataclasses.dataclass
class HeldoutConfig:
    """Held-out evaluation during training (``evaluation`` section of the config)."""

    enabled: bool = True
    """Evaluate on held-out questions before RL (after the warm-up), every ``eval_every`` steps and at the end."""
    split: str = "test"
    """Split of the training task that is held out (procedural math: ``validation`` or ``test``, never ``train``)."""
    heldout_tasks: int = 100
    """Held-out questions: the first ones of ``split``."""
    eval_every: int = 0
    """Also evaluate every this many RL steps (0: only before RL and at the end)."""
    max_eval_tokens: int | None = None
    """Token budget of an evaluation episode (None: the training rollouts' ``max_response_tokens``)."""
    max_batch_size: int = 64
    """Most episodes in flight and decoded together while evaluating: the policy's own limit (32 for the CPU
    policies) is raised to this for the evaluation. Larger decode batches cost less per token; each row holds its
    KV cache (46 KB a token for SmolLM2-135M; a continuous batch adds 512 spare columns to the longest row), so 64
    QA episodes take about 3-4 GB."""
    threads: int | None = None
    """torch threads of the policy while it decodes an evaluation (None: the process's own, by default one per
    core). Rollouts decode on one thread because tools and encoders run beside them; nothing of training runs
    beside an evaluation."""
    weight_format: str | None = "fp32"
    """How the fast CPU policy (`FastPolicy`) decodes the evaluation: ``fp32`` (exact: the trained weights' own
    greedy answers, the same on every run, and the same 100 of 100 with the kernels limited to AVX2: another
    CPU's float32 kernels differ only in the last bits, docs/training.md "fp32 on an AVX2 CPU"), ``int8`` or
    ``bf16`` (lossy where a greedy answer hangs on a near tie: after the default run's warm-up, int8 scored 0.54-0.70
    where fp32 scored 0.71 every time; 0.69 since each row's rounding residual joins the matmuls, but then only 1.3x
    faster at an evaluation's batch, docs/training.md "Held-out evaluation" and "The rounding residual as a second
    row"), or None (the rollout policy's own, ``rollout.weight_format``). Other policies (vLLM, HTTP) decode their own
    way."""
    heldout_env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``gym.make`` keyword arguments of the held-out env on top of the training env's (e.g. a ``dataset`` file
    for a data source that has no ``split``)."""
    confidence: float = 0.95
    """Level of the bootstrap confidence intervals."""
    bootstrap_resamples: int = 2000
    """Bootstrap resamples per interval."""

    def __post_init__(self) -> None:
        if self.split == "train":
            raise ValueError("evaluation.split must be held out: use validation or test, not train")
        if self.heldout_tasks < 1 or self.eval_every < 0 or self.bootstrap_resamples < 1 or self.max_batch_size < 1:
            raise ValueError("evaluation needs heldout_tasks >= 1, eval_every >= 0, bootstrap_resamples >= 1 and "
                             "max_batch_size >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"evaluation.threads must be >= 1 or None (the process's own), got {self.threads}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"evaluation.confidence must be in (0, 1), got {self.confidence}")
        if self.weight_format not in (None, *WEIGHT_FORMATS):
            raise ValueError(f"evaluation.weight_format must be one of {WEIGHT_FORMATS} or null (the rollout "
                             f"policy's own), got {self.weight_format!r}")


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values``."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


@dataclasses.dataclass
class Difference:
    """``after - before`` over paired questions, with its bootstrap interval."""

    mean: float
    low: float
    high: float


def paired_difference(
    before: Sequence[float], after: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Difference:
    """Mean of ``after - before`` question by question, with a paired percentile-bootstrap interval.

    Raises:
        ValueError: when the two evaluations do not cover the same number of questions.
    """
    if len(before) != len(after):
        raise ValueError(f"paired evaluations differ in size: {len(before)} vs {len(after)} questions")
    deltas = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    low, high = bootstrap_ci(deltas, confidence, resamples, seed)
    return Difference(mean=float(deltas.mean()) if deltas.size else float("nan"), low=low, high=high)


@dataclasses.dataclass
class HeldoutResult:
    """One held-out evaluation."""

    step: int
    """RL steps done when it ran (0: before RL, right after the warm-up)."""
    correct: list[float]
    """Per-question accuracy, in question order (for paired comparisons)."""
    metrics: dict[str, float]
    """``eval/accuracy`` with ``eval/accuracy_ci_low``/``_high``, ``eval/format_rate``, ``eval/tool_calls``,
    ``eval/reward``, ``eval/response_tokens`` and ``time/eval_s``."""


def question_accuracy(trajectories: Sequence[Trajectory]) -> list[float]:
    """Accuracy (math) or exact match (QA) of each trajectory, in order."""
    return [float(t.metrics.get("accuracy", t.metrics.get("em", 0.0))) for t in trajectories]


def heldout_metrics(trajectories: Sequence[Trajectory], correct: Sequence[float], config: HeldoutConfig,
                    seed: int) -> dict[str, float]:
    """The ``eval/*`` metrics of one evaluation's trajectories (one per question) and their `question_accuracy`."""
    low, high = bootstrap_ci(correct, config.confidence, config.bootstrap_resamples, seed)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else float("nan")

    return {
        "eval/accuracy": mean(list(correct)),
        "eval/accuracy_ci_low": low,
        "eval/accuracy_ci_high": high,
        "eval/format_rate": mean([float(t.metrics.get("format_ok", 0.0)) for t in trajectories]),
        "eval/tool_calls": mean([float(t.num_tool_calls) for t in trajectories]),
        "eval/reward": mean([float(t.reward) for t in trajectories]),
        "eval/response_tokens": mean([float(len(t.token_ids or []) - (t.prompt_length or 0)) for t in trajectories]),
        "eval/questions": float(len(trajectories)),
    }


def accuracy_by_hops(tasks: Sequence[Any], correct: Sequence[float]) -> dict[str, float]:
    """``eval/accuracy_hops{n}`` for each hop count of multi-hop questions (tasks with ``metadata["hops"]``);
    empty for other tasks.

    Example:
        >>> from rapo_env.tasks.base import Task
        >>> tasks = [Task(id=str(i), question="?", answers=("a",), source="kb", metadata={"hops": h})
        ...          for i, h in enumerate([1, 2, 2])]
        >>> accuracy_by_hops(tasks, [1.0, 0.0, 1.0])
        {'eval/accuracy_hops1': 1.0, 'eval/accuracy_hops2': 0.5}
    """
    hops = [task.metadata.get("hops") for task in tasks]
    if not hops or any(count is None for count in hops):
        return {}
    return {f"eval/accuracy_hops{count}": float(np.mean([c for c, h in zip(correct, hops, strict=True) if h == count]))
            for count in sorted(set(hops))}


def heldout_env_kwargs(env_kwargs: dict[str, Any], config: HeldoutConfig) -> dict[str, Any]:
    """The held-out env's ``gym.make`` keyword arguments: the training env's, with the held-out split and size
    (procedural math, the knowledge base) and ``config.heldout_env_kwargs`` on top."""
    kwargs = dict(env_kwargs)
    if kwargs.get("dataset") == "procedural":
        # Procedural math sizes its question set with num_tasks, the knowledge base with limit.
        size = "num_tasks" if "num_tasks" in kwargs else "limit"
        kwargs.update({"split": config.split, size: config.heldout_tasks})
    kwargs.update(config.heldout_env_kwargs)
    return kwargs


@contextlib.contextmanager
def decoding_settings(policy: Any, **settings: Any) -> Iterator[None]:
    """Set the decoding attributes in ``settings`` that ``policy`` has (``max_batch_size``, ``threads``) for the
    block, and restore them after it; a policy without one (a vLLM or HTTP policy) keeps its own way.

    Example:
        >>> from types import SimpleNamespace
        >>> policy = SimpleNamespace(max_batch_size=32)
        >>> with decoding_settings(policy, max_batch_size=64, threads=2):
        ...     (policy.max_batch_size, hasattr(policy, "threads"))
        (64, False)
        >>> policy.max_batch_size
        32
    """
    saved = {name: getattr(policy, name) for name in settings if hasattr(policy, name)}
    for name in saved:
        setattr(policy, name, settings[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(policy, name, value)


class HeldoutEvaluator:
    """Greedy rollouts of the held-out questions with the training policy.

    Args:
        env: the training env's id (or factory), as the training engine gets it.
        env_kwargs: the training env's ``gym.make`` keyword arguments; the split, the number of questions and
            ``config.heldout_env_kwargs`` are put on top.
        policy: the training rollout policy (the same object, or a `FastPolicy` over the same module in
            ``config.weight_format``: weights are current by construction).
        rollout: the training rollout settings; evaluation decodes greedily, one rollout per question.
        config: what to evaluate.
        seed: seed of the engine and of the bootstrap.
    """

    def __init__(self, env: str | Callable[..., Any], env_kwargs: dict[str, Any], policy: Any,
                 rollout: RolloutConfig, config: HeldoutConfig, seed: int = 0):
        self.config = config
        self.seed = seed
        kwargs = heldout_env_kwargs(env_kwargs, config)
        # No top log-probs: they feed only the step entropy of the retrieval reward, which evaluation never uses.
        greedy = dataclasses.replace(
            rollout, rollout_n=1, temperature=0.0, top_p=1.0, top_k=0, top_logprobs=0, show_progress=False,
            max_response_tokens=config.max_eval_tokens or rollout.max_response_tokens,
            max_concurrent_episodes=max(config.max_batch_size, rollout.max_concurrent_episodes),
        )
        if isinstance(policy, FastPolicy) and config.weight_format is not None:
            policy = policy.in_weight_format(config.weight_format)
        self.engine = RolloutEngine(env, policy, greedy, kwargs)
        self.num_tasks = min(config.heldout_tasks, len(self.engine.tasks))

    @property
    def questions(self) -> list[str]:
        """The held-out questions, in evaluation order."""
        return [task.question for task in list(self.engine.tasks)[: self.num_tasks]]

    def evaluate(self, step: int, show_progress: bool = True) -> HeldoutResult:
        """Play every held-out question once, greedily; metrics plus per-question accuracy."""
        from tqdm.auto import tqdm

        started = time.perf_counter()
        bar = tqdm(total=self.num_tasks, desc=f"held-out eval (step {step})", unit="question",
                   disable=not show_progress, leave=False)
        config = self.config
        with decoding_settings(self.engine.policy, max_batch_size=config.max_batch_size, threads=config.threads):
            trajectories = self.engine.run(list(range(self.num_tasks)), seed=self.seed,
                                           on_trajectory=lambda _: bar.update(1))
        bar.close()
        correct = question_accuracy(trajectories)
        metrics = heldout_metrics(trajectories, correct, self.config, self.seed)
        metrics.update(accuracy_by_hops(list(self.engine.tasks)[: self.num_tasks], correct))
        metrics["time/eval_s"] = time.perf_counter() - started
        return HeldoutResult(step=step, correct=correct, metrics=metrics)

    def close(self) -> None:
        """Release the evaluation envs and their tool workers."""
        self.engine.close()


def evaluates(config: TrainConfig, env_kwargs: dict[str, Any] | None) -> bool:
    """Whether a training run has a held-out evaluation: ``evaluation.enabled``, and the training env's ``gym.make``
    keyword arguments to pick the held-out split from (a run given its own env factory, ``env_kwargs`` None,
    evaluates ``data.env_id`` with ``evaluation.heldout_env_kwargs``, or not at all)."""
    evaluation = config.evaluation
    return evaluation.enabled and (env_kwargs is not None or bool(evaluation.heldout_env_kwargs))


def training_evaluator(env: str | Callable[..., Any], env_kwargs: dict[str, Any] | None, config: TrainConfig,
                       policy: Any) -> HeldoutEvaluator | None:
    """The held-out evaluator of a training run on ``env`` with ``policy``, or None when it has none (`evaluates`)."""
    if not evaluates(config, env_kwargs):
        return None
    return HeldoutEvaluator(config.data.env_id if env_kwargs is None else env, env_kwargs or {}, policy,
                            config.rollout, config.evaluation, seed=config.seed)


def evaluate_under(control: RunControl, evaluator: HeldoutEvaluator | None, step: int,
                   show_progress: bool = False) -> HeldoutResult | None:
    """``evaluator.evaluate(step)`` as the ``evaluation`` phase of a run, printed; None without an evaluator or
    when a signal came (before it, or during it: the evaluation is abandoned)."""
    if evaluator is None or control.requested:
        return None
    result = None
    with control.phase("evaluation", abortable=True):
        print(f"held-out evaluation at step {step}: {evaluator.num_tasks} questions", flush=True)
        result = evaluator.evaluate(step, show_progress=show_progress)
    if result is not None:
        print(report(result))
    return result


def logged_heldout(directory: Path, up_to_step: int) -> list[HeldoutResult]:
    """The held-out evaluations that a run logged in ``directory`` (its ``eval/`` folder), up to a step."""
    path = directory / "metrics.jsonl"
    if not path.is_file():
        return []
    return [HeldoutResult(step=record["step"], correct=list(record.get("correct") or []),
                          metrics={k: v for k, v in record.items() if k not in ("step", "correct")})
            for record in read_metrics(path) if record["step"] <= up_to_step]


def report(result: HeldoutResult) -> str:
    """One line saying what a held-out evaluation measured."""
    metrics = result.metrics
    return (f"held-out accuracy at step {result.step}: {metrics['eval/accuracy']:.3f} "
            f"[{metrics['eval/accuracy_ci_low']:.3f}, {metrics['eval/accuracy_ci_high']:.3f}] on "
            f"{len(result.correct)} questions, format rate {metrics['eval/format_rate']:.2f} "
            f"({metrics['time/eval_s']:.0f} s)")


class HeldoutSchedule:
    """When a training run evaluates the held-out split, and what those evaluations found.

    Before RL (step 0, right after the warm-up, unless a resumed run already has one), after every
    ``every``-th step but the last, and at the end (unless the last step was just evaluated).

    Args:
        evaluate: evaluates the policy as it is at a step; None when it did not run (evaluation off, or a signal).
        every: ``evaluation.eval_every`` (0: only before RL and at the end).
        total_steps: the run's last step.
        results: the evaluations a resumed run already logged, oldest first.

    Example:
        >>> schedule = HeldoutSchedule(lambda step: HeldoutResult(step, [1.0], {}), every=2, total_steps=4)
        >>> schedule.before_rl(0)
        >>> for step in (1, 2, 3, 4):
        ...     schedule.after_step(step)
        >>> schedule.at_end(4)
        >>> [result.step for result in schedule.results]
        [0, 2, 4]
    """

    def __init__(self, evaluate: Callable[[int], HeldoutResult | None], every: int, total_steps: int,
                 results: Sequence[HeldoutResult] = ()):
        self.evaluate, self.every, self.total_steps = evaluate, every, total_steps
        self.results = list(results)
        """The evaluations of the run, oldest first."""

    def before_rl(self, step: int) -> None:
        """Evaluate the warm-up-only policy, once per run."""
        if step == 0 and not self.results:
            self._run(step)

    def after_step(self, step: int) -> None:
        """Evaluate after every ``every``-th step; the last step is left to `at_end`."""
        if self.every and step % self.every == 0 and step < self.total_steps:
            self._run(step)

    def at_end(self, step: int) -> None:
        """Evaluate the final policy, unless that step already was."""
        if not any(result.step == step for result in self.results):
            self._run(step)

    def _run(self, step: int) -> None:
        result = self.evaluate(step)
        if result is not None:
            self.results.append(result)
