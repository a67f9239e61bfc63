"""Build a Step-Trace Buffer from trajectories (spec §3): top K rollouts per question, cut into steps.

A *step* is one model turn plus the tool result that follows it. Each becomes one `StepTrace`:
``key`` = the context before the step (the prompt, i.e. the question without the system prompt,
plus the earlier steps), ``value`` = the step's text with its `` <result>...</result>``,
``reward`` = the trajectory's reward. Observations are the environment's own (what
``StepRecord.observation`` holds), so traces spliced into an off-policy rollout never leak into keys.

Example:
    >>> from rapo_env.trajectory import StepRecord, Trajectory
    >>> def rollout(index, reward):
    ...     steps = [StepRecord(action="<python>2+3</python>", observation=" <result>\\n5\\n</result>"),
    ...              StepRecord(action="<answer>\\\\boxed{5}</answer>", observation="")]
    ...     return Trajectory(task_id="q1", rollout_index=index, question="2+3?", system_prompt="",
    ...                       prompt="2+3?", steps=steps, reward=reward, metrics={}, num_tool_calls=1,
    ...                       end_reason="answer", source="demo")
    >>> traces, stats = build_step_traces([rollout(0, 1.0), rollout(1, 0.0)], BuildConfig(top_k=1))
    >>> [trace.key for trace in traces], stats.trajectories_kept, stats.steps
    (['2+3?', '2+3?<python>2+3</python> <result>\\n5\\n</result>'], 1, 2)
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from rapo_buffers.schema import StepTrace, is_final_step_text, write_buffer
from rapo_env.protocol import extract_boxed
from rapo_env.trajectory import Trajectory, read_jsonl

TokenCounter = Callable[[str], int]
_APPROXIMATE_TOKEN = re.compile(r"\w+|[^\w\s]")


def approximate_token_count(text: str) -> int:
    """Words plus punctuation marks: a model-free stand-in for a tokenizer's count (BPE counts run higher)."""
    return len(_APPROXIMATE_TOKEN.findall(text))


def tokenizer_token_counter(name_or_path: str) -> TokenCounter:
    """Token counts from a Hugging Face tokenizer (loaded offline from a local path or the cache)."""
    from transformers import AutoTokenizer

    from rapo_tools.models import tokenizer_source

    source, kwargs = tokenizer_source(name_or_path)  # "embedded": SmolLM2's tokenizer, offline
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    # Counted as a splice is encoded (`rapo_agents.rollout.episode.encode_env_text`): special-token strings as text.
    return lambda text: len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


@dataclasses.dataclass
class BuildConfig:
    """How trajectories become buffer records."""

    top_k: int = 5
    """Rollouts kept per question, best reward first (the paper keeps 5 of 16)."""
    min_reward: float | None = None
    """Drop trajectories whose reward is below this (None keeps all; the wrapper already falls back on reward <= 0)."""

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


@dataclasses.dataclass
class BuildStats:
    """Counts reported by a build (the paper's: 50,000 trajectories, 169,489 steps, 15.6 M tokens)."""

    trajectories_read: int = 0
    """Trajectories in the input."""
    skipped_lines: int = 0
    """Input lines that were not trajectories."""
    questions: int = 0
    """Distinct questions (task ids)."""
    trajectories_kept: int = 0
    """Trajectories in the buffer (at most ``top_k`` per question)."""
    steps: int = 0
    """Records written: one per step of a kept trajectory."""
    tokens: int = 0
    """Tokens of the kept trajectories' steps (model turns plus tool results)."""
    token_counter: str = "approximate"
    """What counted tokens: ``approximate`` (words and punctuation) or a tokenizer's name."""

    def as_dict(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)


def trajectory_steps(trajectory: Trajectory) -> list[StepTrace]:
    """Cut one trajectory into step records (keys accumulate the prompt and earlier steps)."""
    answer = extract_boxed(trajectory.steps[-1].action) if trajectory.steps else None
    traces: list[StepTrace] = []
    context = trajectory.prompt
    for step_index, step in enumerate(trajectory.steps):
        value = step.action + step.observation
        traces.append(
            StepTrace(
                key=context,
                value=value,
                reward=float(trajectory.reward),
                question_id=trajectory.task_id,
                step_index=step_index,
                is_final=is_final_step_text(step.action),
                answer=answer,
                source=trajectory.source,
            )
        )
        context += value
    return traces


def select_top_rollouts(trajectories: Iterable[Trajectory], config: BuildConfig) -> tuple[list[Trajectory], int, int]:
    """The best ``top_k`` rollouts of each question (ties: lower rollout index first).

    Returns the kept trajectories (grouped by question, in first-seen order), the number read
    and the number of distinct questions.
    """
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    read = 0
    for trajectory in trajectories:
        read += 1
        if config.min_reward is None or trajectory.reward >= config.min_reward:
            groups[trajectory.task_id].append(trajectory)
    kept: list[Trajectory] = []
    for group in groups.values():
        kept.extend(sorted(group, key=lambda t: (-t.reward, t.rollout_index))[: config.top_k])
    return kept, read, len(groups)


def build_step_traces(
    trajectories: Iterable[Trajectory],
    config: BuildConfig | None = None,
    count_tokens: TokenCounter = approximate_token_count,
    token_counter_name: str = "approximate",
) -> tuple[list[StepTrace], BuildStats]:
    """Select the top rollouts per question and cut them into step records; returns the records and counts."""
    config = config or BuildConfig()
    kept, read, questions = select_top_rollouts(trajectories, config)
    traces = [trace for trajectory in kept for trace in trajectory_steps(trajectory)]
    stats = BuildStats(
        trajectories_read=read,
        questions=questions,
        trajectories_kept=len(kept),
        steps=len(traces),
        tokens=sum(count_tokens(trace.value) for trace in traces),
        token_counter=token_counter_name,
    )
    return traces, stats


def _count_nonblank_lines(path: str | os.PathLike[str]) -> int:
    with Path(path).open(encoding="utf-8", errors="replace") as handle:
        return sum(1 for line in handle if line.strip())


def build_buffer(
    trajectories: Iterable[Trajectory],
    output_path: str | os.PathLike[str],
    config: BuildConfig | None = None,
    tokenizer: str | None = None,
) -> BuildStats:
    """Build the buffer from ``trajectories`` and write it to ``output_path``.

    Tokens are counted with the Hugging Face ``tokenizer`` when given, else approximately.
    """
    if tokenizer:
        traces, stats = build_step_traces(trajectories, config, tokenizer_token_counter(tokenizer), tokenizer)
    else:
        traces, stats = build_step_traces(trajectories, config)
    write_buffer(output_path, traces)
    return stats


def build_buffer_file(
    trajectory_paths: Sequence[str | os.PathLike[str]],
    output_path: str | os.PathLike[str],
    config: BuildConfig | None = None,
    tokenizer: str | None = None,
) -> BuildStats:
    """Read rollout JSONL files (as the rollout engine writes them), build the buffer and write it.

    Raises:
        FileNotFoundError: when an input file is missing.
        ValueError: when the inputs hold no trajectory.
    """
    trajectories: list[Trajectory] = []
    skipped = 0
    for path in trajectory_paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no trajectory file at {path}")
        read = read_jsonl(path)
        trajectories.extend(read)
        skipped += _count_nonblank_lines(path) - len(read)
    if not trajectories:
        raise ValueError(f"no trajectories in {', '.join(map(str, trajectory_paths))} ({skipped} unreadable lines)")
    stats = build_buffer(trajectories, output_path, config, tokenizer)
    stats.skipped_lines = skipped
    return stats
