"""Interleaved rounds for benchmarks that compare systems on a shared, busy machine.

Each round runs every system once, in an order that flips every round, and records the load average
after it, so that a load swing hits all systems alike; `spread` gives the median with min and max.

Example:
    >>> results, loads = interleaved_rounds({"a": lambda: 1.0, "b": lambda: 2.0}, rounds=3)
    >>> results, len(loads)
    ({'a': [1.0, 1.0, 1.0], 'b': [2.0, 2.0, 2.0]}, 3)
    >>> spread([3.0, 1.0, 2.0])
    {'median': 2.0, 'min': 1.0, 'max': 3.0}
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any


def interleaved_rounds(systems: dict[str, Callable[[], Any]], rounds: int) -> tuple[dict[str, list[Any]], list[float]]:
    """Run every system once per round (order reversed on odd rounds); their results and each round's load."""
    results: dict[str, list[Any]] = {name: [] for name in systems}
    loads = []
    for round_index in range(rounds):
        order = list(systems) if round_index % 2 == 0 else list(systems)[::-1]
        for name in order:
            results[name].append(systems[name]())
        loads.append(os.getloadavg()[0])
    return results, loads


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def show(values: dict[str, float], digits: int = 1) -> str:
    """``median (min-max)`` of a `spread`."""
    return f"{values['median']:.{digits}f} ({values['min']:.{digits}f}-{values['max']:.{digits}f})"
