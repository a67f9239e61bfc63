"""Procedural multi-step arithmetic word problems: the embedded default math task.

Each problem is generated deterministically from ``(seed, index)``. Its numbers are
large enough that a calculator is worth using, and every problem keeps its gold
solution as a short program (``metadata["solution_program"]``) split into explained
steps (``metadata["steps"]``), which the scripted expert replays through the real
python tool.

Example:
    >>> tasks = ProceduralMath(seed=0, num_tasks=3, difficulty=2)
    >>> task = tasks[0]
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, "-c", task.metadata["solution_program"]],
    ...                      capture_output=True, text=True).stdout.strip()
    >>> out == task.answers[0]
    True
"""

from __future__ import annotations

import dataclasses
import random

from rapo_env.tasks.base import Task, TaskList

MAX_DIFFICULTY = 5


@dataclasses.dataclass(frozen=True)
class _Scenario:
    place: str
    items: str
    variable: str
    opening: str
    more: str
    fewer: str
    times: str
    share: str
    percent_gone: str


_SCENARIOS = (
    _Scenario("warehouse", "bolts", "bolts",
              "A warehouse receives {a} crates with {b} bolts in each crate.",
              "A second delivery brings {n} more bolts.",
              "The warehouse ships {n} bolts to a customer.",
              "After a merger, the warehouse's stock of bolts becomes {n} times as large.",
              "The bolts are split evenly among {n} branch stores, and the warehouse keeps one store's share.",
              "{n}% of the bolts are found to be rusty and are thrown away."),
    _Scenario("library", "books", "books",
              "A library has {a} shelves holding {b} books each.",
              "It receives a donation of {n} books.",
              "It lends out {n} books that are not returned this year.",
              "A new wing opens and the collection grows to {n} times its size.",
              "The books are divided equally among {n} reading rooms; count only the first room.",
              "{n}% of the books are sold at a fair."),
    _Scenario("farm", "apples", "apples",
              "An orchard has {a} trees and each tree gives {b} apples.",
              "The farmer buys {n} more apples from a neighbour.",
              "{n} apples are eaten by birds.",
              "A bumper season makes the harvest {n} times as big.",
              "The apples are packed equally into {n} trucks; consider the load of one truck.",
              "{n}% of the apples are pressed into juice."),
    _Scenario("bakery", "cookies", "cookies",
              "A bakery bakes {a} trays with {b} cookies on each tray.",
              "An extra batch adds {n} cookies.",
              "The morning customers buy {n} cookies.",
              "For a festival the bakery scales production to {n} times as many cookies.",
              "The cookies are shared equally among {n} shops; follow one shop's share.",
              "{n}% of the cookies are given away as samples."),
)

_OPERATIONS = ("more", "fewer", "times", "share", "percent_gone")


def _divisors(value: int, low: int, high: int) -> list[int]:
    return [d for d in range(low, high + 1) if value % d == 0]


def generate_problem(seed: int, index: int, difficulty: int) -> Task:
    """Generate problem ``index`` of the stream ``seed`` with ``difficulty`` operations after the opening."""
    if not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be between 1 and {MAX_DIFFICULTY}, got {difficulty}")
    rng = random.Random(f"rapo-procedural-math:{seed}:{index}:{difficulty}")
    scenario = rng.choice(_SCENARIOS)
    scale = 10 ** (1 + difficulty // 2)
    a, b = rng.randint(12, 9 * scale), rng.randint(11, 99)
    value = a * b
    name = scenario.variable
    sentences = [scenario.opening.format(a=a, b=b)]
    steps = [(f"Start with {a} x {b} {scenario.items}.", f"{name} = {a} * {b}")]
    while len(steps) <= difficulty:
        operation = rng.choice(_OPERATIONS)
        if operation == "more":
            n = rng.randint(value // 10 + 1, value // 2 + 2)
            value, code = value + n, f"{name} = {name} + {n}"
        elif operation == "fewer":
            if value < 4:
                continue
            n = rng.randint(1, value // 2)
            value, code = value - n, f"{name} = {name} - {n}"
        elif operation == "times":
            if value > 10**9:
                continue
            n = rng.randint(2, 9)
            value, code = value * n, f"{name} = {name} * {n}"
        elif operation == "share":
            options = _divisors(value, 2, 19)
            if not options:
                continue
            n = rng.choice(options)
            value, code = value // n, f"{name} = {name} // {n}"
        else:
            options = [p for p in (10, 20, 25, 40, 50, 75) if value * p % 100 == 0]
            if not options:
                continue
            n = rng.choice(options)
            value, code = value - value * n // 100, f"{name} = {name} - {name} * {n} // 100"
        sentences.append(getattr(scenario, operation).format(n=n))
        steps.append((sentences[-1], code))
    question = " ".join(sentences) + f" How many {scenario.items} are there at the end?"
    program = "\n".join(code for _, code in steps) + f"\nprint({name})"
    return Task(
        id=f"procmath-s{seed}-d{difficulty}-{index}",
        question=question,
        answers=(str(value),),
        source="procedural_math",
        metadata={"solution_program": program, "steps": steps, "variable": name, "difficulty": difficulty},
    )


class ProceduralMath(TaskList):
    """A fixed-size, seeded list of procedural problems.

    Args:
        seed: Stream seed; the train and test splits use different seeds.
        num_tasks: How many problems.
        difficulty: Number of operations after the opening (1-5), or None to cycle through 1-4.
    """

    def __init__(self, seed: int = 0, num_tasks: int = 1000, difficulty: int | None = None):
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be positive, got {num_tasks}")
        self.seed, self.difficulty = seed, difficulty
        super().__init__(
            "procedural_math",
            (generate_problem(seed, i, difficulty or 1 + i % 4) for i in range(num_tasks)),
        )


SPLIT_SEEDS = {"train": 0, "validation": 7919, "test": 104729}
"""Seeds of the procedural splits, so that train and test problems differ."""
