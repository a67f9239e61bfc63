"""Shared output of the benchmark scripts: a printed table and a JSON file in benchmarks/results/."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
"""The shipped configs, found from this file so that a benchmark runs from any working directory."""


def report(name: str, title: str, columns: list[str], rows: list[dict[str, Any]], extra: dict[str, Any] | None = None
           ) -> Path:
    """Print ``rows`` as a table under ``title`` and write them, with machine facts, to ``results/<name>.json``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns))
    Console(width=200).print(table)  # a log file is not a terminal: keep every column readable
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.machine(),
               "python": platform.python_version(), "rows": rows, **(extra or {})}
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
    return path
