"""Python sandbox throughput and latency: the pooled, isolated ``local`` backend vs ``python -c`` per call.

Three snippets, each at concurrency 1 and 8:

- (a) ``print(sum(range(10**4)))``;
- (b) sympy solving a quadratic equation;
- (c) a 50 ms numeric loop.

The baseline is the reference implementation's way: a fresh ``python -c`` process per call
(rapo's ``subprocess`` backend), measured in the same run. Prints a table with executions
per second, p50/p99 latency and the local/baseline ratios; writes
``benchmarks/results/sandbox.json``.

Example:
    python benchmarks/sandbox.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rapo_tools.aio import run_sync  # noqa: E402
from rapo_tools.sandbox import SandboxConfig, make_executor  # noqa: E402

SNIPPETS = {
    "a_sum": "print(sum(range(10**4)))",
    "b_sympy": "import sympy\nx = sympy.symbols('x')\nprint(sympy.solve(x**2 - 5*x + 6, x))",
    "c_loop50ms": (
        "import time\nstart = time.perf_counter()\ntotal = 0.0\n"
        "while time.perf_counter() - start < 0.05:\n    total += (total + 1.0) ** 0.5\nprint(round(total))"
    ),
}
CONCURRENCY = (1, 8)


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


async def measure(executor, code: str, calls: int, concurrency: int) -> dict:
    """Run ``calls`` executions, ``concurrency`` at a time; returns throughput and latency figures."""
    latencies: list[float] = []
    failures = 0
    queue = iter(range(calls))

    async def client() -> None:
        nonlocal failures
        for _ in queue:
            start = time.perf_counter()
            result = await executor.run(code)
            latencies.append(time.perf_counter() - start)
            failures += not result.ok

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "calls": calls,
        "failures": failures,
        "execs_per_s": calls / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * percentile(latencies, 0.99),
    }


def call_counts(quick: bool) -> dict[tuple[str, str], int]:
    """Calls per (backend, snippet): enough for stable medians, bounded for the slow baseline."""
    scale = 0.25 if quick else 1.0
    counts = {}
    for snippet in SNIPPETS:
        counts[("local", snippet)] = int((100 if snippet == "c_loop50ms" else 400) * scale)
        counts[("python -c", snippet)] = int((16 if snippet == "b_sympy" else 48) * scale)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (about a quarter of the calls)")
    parser.add_argument("--pool-size", type=int, default=None, help="warm workers of the local backend")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "sandbox.json")
    args = parser.parse_args()

    local = make_executor(SandboxConfig(backend="local", pool_size=args.pool_size, timeout_s=30))
    baseline = make_executor(SandboxConfig(backend="subprocess", timeout_s=60))
    executors = {"local": local, "python -c": baseline}
    for _ in range(local.config.workers * 2):  # start and warm the pool before timing
        run_sync(local.run("pass"))

    counts = call_counts(args.quick)
    cells = [(name, snippet, concurrency) for snippet in SNIPPETS for concurrency in CONCURRENCY for name in executors]
    rows = []
    for name, snippet, concurrency in tqdm(cells, desc="sandbox benchmark"):
        figures = run_sync(measure(executors[name], SNIPPETS[snippet], counts[(name, snippet)], concurrency))
        rows.append({"backend": name, "snippet": snippet, "concurrency": concurrency, **figures})
    run_sync(local.aclose())

    ratios = []
    for snippet in SNIPPETS:
        for concurrency in CONCURRENCY:
            mine, base = (next(r for r in rows if r["backend"] == b and r["snippet"] == snippet
                               and r["concurrency"] == concurrency) for b in ("local", "python -c"))
            ratios.append({
                "snippet": snippet,
                "concurrency": concurrency,
                "throughput_ratio": mine["execs_per_s"] / base["execs_per_s"],
                "p50_ratio": base["p50_ms"] / mine["p50_ms"],
            })
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                    "load_average_1m": os.getloadavg()[0]},
        "local_isolated": local.isolated,
        "local_pool_size": local.config.workers,
        "local_preloaded": list(local.config.preload_modules),
        "rows": rows,
        "ratios": ratios,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print_table(rows, ratios)
    print(f"isolation on: {local.isolated}; pool size {local.config.workers}; wrote {args.output}")
    return 0


def print_table(rows: list[dict], ratios: list[dict]) -> None:
    """One line per snippet and concurrency: both backends and the ratios."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="python sandbox: local (pooled, bubblewrap) vs python -c per call")
    for column in ("snippet", "conc", "local exec/s", "local p50 ms", "local p99 ms",
                   "python -c exec/s", "python -c p50 ms", "python -c p99 ms", "throughput x", "p50 x"):
        table.add_column(column, justify="right")
    for ratio in ratios:
        mine, base = (next(r for r in rows if r["backend"] == b and r["snippet"] == ratio["snippet"]
                           and r["concurrency"] == ratio["concurrency"]) for b in ("local", "python -c"))
        table.add_row(
            ratio["snippet"], str(ratio["concurrency"]),
            f"{mine['execs_per_s']:.1f}", f"{mine['p50_ms']:.1f}", f"{mine['p99_ms']:.1f}",
            f"{base['execs_per_s']:.1f}", f"{base['p50_ms']:.1f}", f"{base['p99_ms']:.1f}",
            f"{ratio['throughput_ratio']:.1f}", f"{ratio['p50_ratio']:.1f}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
