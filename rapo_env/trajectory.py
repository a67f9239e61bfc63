"""The trajectory record that every rollout writes as JSONL and the step-trace buffer builder reads.

Example:
    >>> import tempfile, os
    >>> step = StepRecord(action="<python>1+1</python>", observation=" <result>\\n2\\n</result>", tool="python")
    >>> trajectory = Trajectory(task_id="t-0", rollout_index=0, question="1+1?", system_prompt="", prompt="1+1?",
    ...                         steps=[step], reward=1.0, metrics={}, num_tool_calls=1, end_reason="answer",
    ...                         source="example")
    >>> path = os.path.join(tempfile.mkdtemp(), "trajectories.jsonl")
    >>> write_jsonl(path, [trajectory])
    >>> read_jsonl(path)[0].response == trajectory.response
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rapo_tools import jsonl


@dataclasses.dataclass
class StepRecord:
    """One step: the policy's turn and what the env answered."""

    action: str
    """The policy's text of this turn."""
    observation: str
    """What the env returned (a `` <result>`` block; empty after the answer), without spliced retrievals."""
    tool: str | None = None
    """The tag of the tool the env ran, if any."""
    tool_ok: bool | None = None
    """Whether that tool call succeeded."""
    retrieval: dict[str, Any] | None = None
    """The retrieval wrapper's ``info["retrieval"]`` for this step (None without a splice)."""
    token_start: int | None = None
    """Start of this turn's policy tokens in `Trajectory.token_ids`."""
    token_end: int | None = None
    """End (exclusive) of this turn's policy tokens in `Trajectory.token_ids`."""
    entropy_paper: float | None = None
    """Mean full-vocabulary entropy of the turn's tokens (spec §5, paper)."""
    entropy_reference: float | None = None
    """Top-10 entropy summed over the first 20 tokens / log|V| (spec §5, reference)."""


@dataclasses.dataclass
class Trajectory:
    """One episode of one rollout of one question."""

    task_id: str
    rollout_index: int
    question: str
    system_prompt: str
    prompt: str
    """The user turn given by ``reset``."""
    steps: list[StepRecord]
    reward: float
    metrics: dict[str, float]
    num_tool_calls: int
    end_reason: str
    """``answer``, ``tool_limit``, ``turn_limit`` or ``length`` (token budget)."""
    source: str
    """Who produced it (policy or agent name)."""
    token_ids: list[int] | None = None
    """The whole token context: prompt, policy turns, observations and spliced text."""
    loss_mask: list[int] | None = None
    """1 for tokens the policy generated, 0 elsewhere (same length as ``token_ids``)."""
    logprobs: list[float] | None = None
    """Log-probabilities of the policy tokens under the rollout policy (0 elsewhere)."""
    prompt_length: int | None = None
    """Number of tokens of the templated prompt at the start of ``token_ids``."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Anything else a producer wants to keep."""

    @property
    def response(self) -> str:
        """The transcript the env scored: each action followed by its observation."""
        return "".join(step.action + step.observation for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Rebuild from `to_dict` output; unknown keys go to ``extra``."""
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["steps"] = [StepRecord(**step) for step in data.get("steps", [])]
        values.setdefault("extra", {}).update({k: v for k, v in data.items() if k not in known})
        return cls(**values)


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> None:
    """Write trajectories, one JSON object per line (`rapo_tools.jsonl`: atomic unless appending)."""
    jsonl.write_jsonl(path, (trajectory.to_dict() for trajectory in trajectories), append=append)


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories; lines that are not trajectory records are skipped and counted (`rapo_tools.jsonl`)."""
    return jsonl.read_jsonl(path, Trajectory.from_dict, what="trajectory records")
