"""Turn GSM8K training solutions into tool-using trajectories: a buffer from human demonstrations.

Each ``<<expr=result>>`` calculator annotation becomes a ``<python>`` step whose result is what
Python really prints for ``expr`` (``48/2`` gives ``24.0``), evaluated by a small arithmetic
evaluator with Python's own semantics (no code is executed). The reasoning text that leads up
to a calculation becomes the step's ``<think>``; the last step answers with ``\\boxed{}`` the
number after ``####``. Annotations that are not plain arithmetic stay in the reasoning text
as the human wrote them and are counted.

Example:
    >>> turns = solution_turns("She sold 48/2 = <<48/2=24>>24 clips.\\n#### 24")
    >>> turns.steps[0]
    ('<think>\\nShe sold 48/2 =\\n</think>\\n<python>\\n48/2\\n</python>', ' <result>\\n24.0\\n</result>')
    >>> turns.steps[-1][0]
    '<think>\\n24 clips.\\n</think>\\n<answer>\\\\boxed{24}</answer>'
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import operator
import os
import re
from collections.abc import Iterator
from typing import Any

from rapo_env.protocol import format_result
from rapo_env.trajectory import StepRecord, Trajectory
from rapo_tools.jsonl import JsonlReader

SOURCE = "gsm8k_train"
_ANNOTATION = re.compile(r"<<([^<>]*)=([^<>=]*)>>")
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_EXPONENT = 64
_MAX_EXPRESSION_CHARS = 200


def evaluate_arithmetic(expression: str) -> int | float | None:
    """Value of a plain arithmetic expression, as Python computes it; None when it is not one (or fails)."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None

    def value_of(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value_of(node.left), value_of(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError("exponent too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value_of(node.operand))
        raise ValueError(f"not arithmetic: {type(node).__name__}")

    try:
        return value_of(tree.body)
    except (ValueError, ArithmeticError, TypeError):
        return None


@dataclasses.dataclass
class SolutionTurns:
    """A GSM8K solution as agent turns."""

    steps: list[tuple[str, str]]
    """(action, observation) pairs: python steps, then the answer step (observation "")."""
    answer: str | None
    """The number after ``####``; None when the solution has none (then there is no answer step)."""
    unconverted: int = 0
    """Annotations left as text because their expression is not plain arithmetic."""


def _think(text: str) -> str:
    return f"<think>\n{text.strip()}\n</think>\n" if text.strip() else ""


def solution_turns(solution: str) -> SolutionTurns:
    """Split one GSM8K solution (``answer`` field) into python steps and an answer step."""
    body, _, final = solution.rpartition("####")
    if not _:
        body, final = solution, ""
    answer = final.strip().replace(",", "") or None
    steps: list[tuple[str, str]] = []
    unconverted = 0
    pending = ""  # reasoning text not yet attached to a step
    position = 0
    for match in _ANNOTATION.finditer(body):
        expression = match.group(1).strip()
        value = evaluate_arithmetic(expression)
        if value is None:
            unconverted += 1
            pending += body[position : match.start()] + f"{expression} = {match.group(2).strip()}"
            position = match.end()
            continue
        pending += body[position : match.start()]
        steps.append((f"{_think(pending)}<python>\n{expression}\n</python>", format_result(str(value))))
        pending, position = "", match.end()
    pending += body[position:]
    if answer is not None:
        steps.append((f"{_think(pending)}<answer>\\boxed{{{answer}}}</answer>", ""))
    return SolutionTurns(steps=steps, answer=answer, unconverted=unconverted)


def gsm8k_trajectories(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[Trajectory]:
    """Trajectories (reward 1.0: human solutions are correct) from a GSM8K JSONL file.

    Lines that are not ``{"question": str, "answer": str}`` objects, and solutions without a ``####`` answer, are
    skipped and counted (`rapo_tools.jsonl.JsonlReader`).
    """
    rows = JsonlReader(path, _solution_row, what="GSM8K solutions with a #### answer")
    for line_number, _, (row, turns) in itertools.islice(rows.with_positions(), limit):
        steps = [
            StepRecord(action=action, observation=observation, tool="python" if observation else None,
                       tool_ok=bool(observation) or None)
            for action, observation in turns.steps
        ]
        yield Trajectory(
            task_id=f"{SOURCE}-{line_number - 1}",  # the 0-based line index, as buffers built before named them
            rollout_index=0,
            question=row["question"],
            system_prompt="",
            prompt=row["question"],
            steps=steps,
            reward=1.0,
            metrics={"unconverted_annotations": float(turns.unconverted)},
            num_tool_calls=len(steps) - 1,
            end_reason="answer",
            source=SOURCE,
        )


def _solution_row(row: Any) -> tuple[dict[str, Any], SolutionTurns]:
    """A GSM8K row and its solution's turns; ``ValueError`` for a row that is not one (skipped and counted)."""
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
        raise ValueError('not a {"question": str, "answer": str} object')
    turns = solution_turns(row["answer"])
    if turns.answer is None:
        raise ValueError("the solution has no #### answer")
    return row, turns
