"""Python sandbox throughput and latency: the pooled, isolated ``local`` backend vs ``python -c`` per call.

Three snippets, each at concurrency 1 and 8:

- (a) ``print(sum(range(10**4)))``;
- (b) sympy solving a quadratic equation;
- (c) a 50 ms numeric loop.

The baseline is the reference implementation's way: a fresh ``python -c`` process per call
(rapo's ``subprocess`` backend), measured in the same run. Prints a table with executions
per second, p50/p99 latency and the local/baseline ratios, then whether each target of
issue #3 is met: for (a) and (b), at concurrency 1 and 8, at least 20x the baseline's
throughput with a p50 latency of 15 ms or less (isolation on). Latency is what a caller
sees, waiting for a free worker included. With ``--repeats N`` every figure is the median
of N whole runs. Writes ``benchmarks/results/sandbox.json`` (every run, the medians, the
verdicts and the load average before and after).

With ``--before-tree DIR`` (a checkout of an older commit, e.g. ``git worktree add /tmp/old
<commit>``), the same run also measures that checkout's local and ``python -c`` backends, in a
helper process, cell by cell between this tree's cells, and prints the now/before ratios: what a
change (issue #15's hardening, say) costs per call.

Example:
    python benchmarks/sandbox.py --quick
    flock /tmp/bench.lock python benchmarks/sandbox.py --repeats 3
    git worktree add /tmp/old HEAD~3 && python benchmarks/sandbox.py --quick --before-tree /tmp/old
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from rapo_tools.aio import run_sync
from rapo_tools.sandbox import SandboxConfig, make_executor

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


async def warm(executor, code: str, calls: int) -> None:
    """``calls`` runs of ``code`` at once, so that every worker of its pool is up (a call waits for its own)."""
    await asyncio.gather(*(executor.run(code) for _ in range(calls)))


def make_executors(pool_size: int | None, light_pool_size: int | None) -> dict:
    """The local backend (both pools started and warm) and the ``python -c`` baseline."""
    local = make_executor(SandboxConfig(backend="local", pool_size=pool_size, light_pool_size=light_pool_size,
                                        timeout_s=30))
    for snippet in ("pass", "import sympy"):  # start and warm both pools (light and full) before timing
        for _ in range(2):
            run_sync(warm(local, snippet, max(local.config.workers, local.config.light_workers)))
    return {"local": local, "python -c": make_executor(SandboxConfig(backend="subprocess", timeout_s=60))}


def in_process(executor):
    """A cell measurer for an executor of this process."""
    return lambda code, calls, concurrency: run_sync(measure(executor, code, calls, concurrency))


# Runs in an older checkout (argv: its directory, this file, the pool sizes as JSON): its rapo_tools is imported
# first, so that this file's functions, loaded next, measure that checkout's executors. One JSON line per cell.
_BEFORE_HELPER = r"""
import importlib.util, json, sys
tree, here, sizes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, tree)
import rapo_tools.sandbox
spec = importlib.util.spec_from_file_location("sandbox_benchmark", here)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
executors = bench.make_executors(*sizes)
print(json.dumps({"isolated": executors["local"].isolated, "module": rapo_tools.sandbox.__file__}), flush=True)
for line in sys.stdin:
    cell = json.loads(line)
    print(json.dumps(bench.in_process(executors[cell["backend"]])(cell["code"], cell["calls"], cell["concurrency"])),
          flush=True)
bench.run_sync(executors["local"].aclose())
"""


class BeforeTree:
    """The backends of an older checkout, measured in a helper process one cell at a time."""

    def __init__(self, tree: Path, pool_size: int | None, light_pool_size: int | None) -> None:
        if not (tree / "rapo_tools" / "sandbox").is_dir():
            raise SystemExit(f"--before-tree {tree}: not a rapo checkout (no rapo_tools/sandbox there)")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BEFORE_HELPER, str(tree), str(Path(__file__).resolve()),
             json.dumps([pool_size, light_pool_size])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
        )
        self.facts = self._answer()

    def _answer(self) -> dict:
        assert self.process.stdout  # created with PIPE above
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("the --before-tree helper stopped (see its error above)")
        return json.loads(line)

    def measurer(self, backend: str):
        """A cell measurer for ``backend`` of the older checkout."""
        def measure_there(code: str, calls: int, concurrency: int) -> dict:
            assert self.process.stdin  # created with PIPE above
            self.process.stdin.write(json.dumps({"backend": backend, "code": code, "calls": calls,
                                                 "concurrency": concurrency}) + "\n")
            self.process.stdin.flush()
            return self._answer()
        return measure_there

    def close(self) -> None:
        assert self.process.stdin  # created with PIPE above
        self.process.stdin.close()
        self.process.wait(timeout=120)


BEFORE = " (before)"
"""Suffix of the backends of the ``--before-tree`` checkout."""


def call_counts(quick: bool) -> dict[tuple[str, str], int]:
    """Calls per (backend, snippet): enough for stable medians, bounded for the slow baseline."""
    scale = 0.25 if quick else 1.0
    counts = {}
    for snippet in SNIPPETS:
        for suffix in ("", BEFORE):
            counts[("local" + suffix, snippet)] = int((100 if snippet == "c_loop50ms" else 400) * scale)
            counts[("python -c" + suffix, snippet)] = int((16 if snippet == "b_sympy" else 48) * scale)
    return counts


TARGET_SNIPPETS = ("a_sum", "b_sympy")
TARGET_THROUGHPUT_RATIO = 20.0
TARGET_P50_MS = 15.0


def run_once(measurers: dict, counts: dict[tuple[str, str], int], label: str) -> list[dict]:
    """Every (backend, snippet, concurrency) cell once, the backends interleaved; returns one row per cell."""
    cells = [(name, snippet, concurrency) for snippet in SNIPPETS for concurrency in CONCURRENCY for name in measurers]
    rows = []
    for name, snippet, concurrency in tqdm(cells, desc=label):
        figures = measurers[name](SNIPPETS[snippet], counts[(name, snippet)], concurrency)
        rows.append({"backend": name, "snippet": snippet, "concurrency": concurrency, **figures})
    return rows


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per cell, the median of each figure over the runs (failures are summed)."""
    rows = []
    for cells in zip(*runs, strict=True):
        row = {key: cells[0][key] for key in ("backend", "snippet", "concurrency")}
        row["calls"] = sum(cell["calls"] for cell in cells)
        row["failures"] = sum(cell["failures"] for cell in cells)
        for key in ("execs_per_s", "p50_ms", "p99_ms"):
            row[key] = statistics.median(cell[key] for cell in cells)
        rows.append(row)
    return rows


def find_row(rows: list[dict], backend: str, snippet: str, concurrency: int) -> dict:
    """The row of one cell."""
    return next(r for r in rows if (r["backend"], r["snippet"], r["concurrency"]) == (backend, snippet, concurrency))


def compare(rows: list[dict]) -> list[dict]:
    """Per snippet and concurrency: the local backend against the baseline, and the target verdicts."""
    ratios = []
    for snippet in SNIPPETS:
        for concurrency in CONCURRENCY:
            mine, base = (find_row(rows, backend, snippet, concurrency) for backend in ("local", "python -c"))
            throughput_ratio = mine["execs_per_s"] / base["execs_per_s"]
            entry = {"snippet": snippet, "concurrency": concurrency, "throughput_ratio": throughput_ratio,
                     "p50_ratio": base["p50_ms"] / mine["p50_ms"]}
            if snippet in TARGET_SNIPPETS:
                entry["throughput_target_met"] = throughput_ratio >= TARGET_THROUGHPUT_RATIO
                entry["p50_target_met"] = mine["p50_ms"] <= TARGET_P50_MS
            ratios.append(entry)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (about a quarter of the calls)")
    parser.add_argument("--repeats", type=int, default=1, help="whole runs; every figure is their median")
    parser.add_argument("--pool-size", type=int, default=None, help="warm workers of the local backend")
    parser.add_argument("--light-pool-size", type=int, default=None, help="light warm workers of the local backend")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "sandbox.json")
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="an older checkout whose backends are measured in the same run, for now/before ratios")
    args = parser.parse_args()

    executors = make_executors(args.pool_size, args.light_pool_size)
    local = executors["local"]
    measurers = {name: in_process(executor) for name, executor in executors.items()}
    before = BeforeTree(args.before_tree.resolve(), args.pool_size, args.light_pool_size) if args.before_tree else None
    if before:
        measurers.update({name + BEFORE: before.measurer(name) for name in executors})

    counts = call_counts(args.quick)
    load_before = os.getloadavg()
    runs = [run_once(measurers, counts, f"sandbox benchmark, run {i + 1}/{args.repeats}") for i in range(args.repeats)]
    load_after = os.getloadavg()
    run_sync(local.aclose())
    if before:
        before.close()

    rows = median_rows(runs)
    ratios = compare(rows)
    changes = compare_before(rows) if before else []
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                    "load_average_before": load_before, "load_average_after": load_after},
        "local_isolated": local.isolated,
        "local_pool_size": local.config.workers,
        "local_light_pool_size": local.config.light_workers,
        "local_preloaded": list(local.config.preload_modules),
        "repeats": args.repeats,
        "targets": {"snippets": list(TARGET_SNIPPETS), "throughput_ratio": TARGET_THROUGHPUT_RATIO,
                    "p50_ms": TARGET_P50_MS},
        "rows": rows,
        "ratios": ratios,
        "before_tree": {"path": str(args.before_tree), **before.facts, "now_vs_before": changes} if before else None,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print_table(rows, ratios)
    if before:
        print_before_table(changes, args.before_tree)
    print_verdicts(rows, ratios, local.isolated)
    print(f"pool size {local.config.workers} (light {local.config.light_workers}); {args.repeats} run(s), "
          f"medians shown; load average (1, 5, 15 min) {_load(load_before)} before, {_load(load_after)} after; "
          f"wrote {args.output}")
    return 0


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.2f}" for value in load)


def print_verdicts(rows: list[dict], ratios: list[dict], isolated: bool) -> None:
    """One line per target cell: met or not, and by what margin."""
    print(f"targets (issue #3): >= {TARGET_THROUGHPUT_RATIO:g}x the python -c throughput and p50 <= "
          f"{TARGET_P50_MS:g} ms, isolation on ({'yes' if isolated else 'NO: every target fails'})")
    for ratio in ratios:
        if "p50_target_met" not in ratio:
            continue
        mine = find_row(rows, "local", ratio["snippet"], ratio["concurrency"])
        met = ratio["throughput_target_met"] and ratio["p50_target_met"] and isolated
        line = (f"  {ratio['snippet']:>8} c{ratio['concurrency']}: throughput {ratio['throughput_ratio']:.1f}x "
                f"({'met' if ratio['throughput_target_met'] else 'NOT met'}), p50 {mine['p50_ms']:.1f} ms "
                f"({'met' if ratio['p50_target_met'] else 'NOT met'}) -> {'MET' if met else 'NOT MET'}")
        if not ratio["p50_target_met"] and ratio["concurrency"] > 1:
            # Little's law: with every client always waiting on a call, p50 is about concurrency / throughput.
            needed = 1000 * ratio["concurrency"] / TARGET_P50_MS
            line += (f"; at c{ratio['concurrency']} that p50 needs ~{needed:.0f} execs/s, "
                     f"measured {mine['execs_per_s']:.0f}")
        print(line)


def compare_before(rows: list[dict]) -> list[dict]:
    """Per backend, snippet and concurrency: this tree's figures over the older checkout's."""
    changes = []
    for backend in ("local", "python -c"):
        for snippet in SNIPPETS:
            for concurrency in CONCURRENCY:
                now, then = (find_row(rows, backend + suffix, snippet, concurrency) for suffix in ("", BEFORE))
                changes.append({"backend": backend, "snippet": snippet, "concurrency": concurrency,
                                "execs_per_s_now": now["execs_per_s"], "execs_per_s_before": then["execs_per_s"],
                                "throughput_now_over_before": now["execs_per_s"] / then["execs_per_s"],
                                "p50_ms_now": now["p50_ms"], "p50_ms_before": then["p50_ms"]})
    return changes


def print_before_table(changes: list[dict], tree: Path) -> None:
    """One line per backend, snippet and concurrency: now against the older checkout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"now vs before ({tree}), measured interleaved in the same run")
    for column in ("backend", "snippet", "conc", "exec/s now", "exec/s before", "now/before", "p50 ms now",
                   "p50 ms before"):
        table.add_column(column, justify="right")
    for change in changes:
        table.add_row(change["backend"], change["snippet"], str(change["concurrency"]),
                      f"{change['execs_per_s_now']:.1f}", f"{change['execs_per_s_before']:.1f}",
                      f"{change['throughput_now_over_before']:.2f}", f"{change['p50_ms_now']:.1f}",
                      f"{change['p50_ms_before']:.1f}")
    Console(width=160).print(table)


def print_table(rows: list[dict], ratios: list[dict]) -> None:
    """One line per snippet and concurrency: both backends and the ratios."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="python sandbox: local (pooled, bubblewrap) vs python -c per call")
    for column in ("snippet", "conc", "local exec/s", "local p50 ms", "local p99 ms",
                   "python -c exec/s", "python -c p50 ms", "python -c p99 ms", "throughput x", "p50 x"):
        table.add_column(column, justify="right")
    for ratio in ratios:
        cell = (ratio["snippet"], ratio["concurrency"])
        mine, base = (find_row(rows, backend, *cell) for backend in ("local", "python -c"))
        table.add_row(
            ratio["snippet"], str(ratio["concurrency"]),
            f"{mine['execs_per_s']:.1f}", f"{mine['p50_ms']:.1f}", f"{mine['p99_ms']:.1f}",
            f"{base['execs_per_s']:.1f}", f"{base['p50_ms']:.1f}", f"{base['p99_ms']:.1f}",
            f"{ratio['throughput_ratio']:.1f}", f"{ratio['p50_ratio']:.1f}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
