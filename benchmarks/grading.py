"""Answer-checking throughput: one math-verify worker behind one lock (before issue #21) vs a pool of workers.

Run: ``python benchmarks/grading.py [--rounds 3] [--workers N]``. A batch of 256 mixed answer checks built
from MATH500's gold answers (rewritten equal forms, wrong values, symbolic forms) is graded from 8 threads,
as rollout threads and vector envs do. A pool of one worker is exactly the old design (one child process,
one global queue), so both systems run the same code in the same run, interleaved over rounds. Each round
starts fresh pools (``cold``: child start-up and first sight of each answer form included) and then grades
the same batch again on them (``warm``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _report import report
from rapo_env.rewards.equivalence import VerifierPool, default_pool_size

DATA = Path(os.environ.get("RAPO_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def mixed_checks(count: int) -> list[tuple[str, str]]:
    """``count`` (gold, prediction) pairs that all need math-verify: equal rewrites, wrong values, and both
    of those for symbolic answers (fractions, roots, tuples, intervals)."""
    rows = [json.loads(line) for line in (DATA / "math" / "math500_test.jsonl").open()]
    golds = [row["answer"] for row in rows if 0 < len(row["answer"]) < 60]
    checks: list[tuple[str, str]] = []
    for index, gold in enumerate(golds):
        other = golds[(index * 7 + 3) % len(golds)]
        checks.append((gold, f"\\left({gold}\\right)" if index % 2 else f"{{{gold}}}"))
        checks.append((gold, other))
        if len(checks) >= count:
            break
    return checks[:count]


def grade(pool: VerifierPool, checks: list[tuple[str, str]], threads: int) -> tuple[float, int]:
    """Seconds to grade ``checks`` from ``threads`` threads, and how many were judged equal."""
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as executor:
        verdicts = list(executor.map(lambda pair: pool.equivalent(pair[0], pair[1], 5.0), checks))
    return time.perf_counter() - start, sum(verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checks", type=int, default=256)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--workers", type=int, default=default_pool_size(),
                        help="pool size of the 'after' system (default: what answers_equivalent uses here)")
    args = parser.parse_args()
    checks = mixed_checks(args.checks)
    systems = {"before: 1 worker, one lock": 1, f"after: pool of {args.workers}": args.workers}
    timings: dict[str, dict[str, list[float]]] = {name: {"cold": [], "warm": []} for name in systems}
    equal: dict[str, set[int]] = {name: set() for name in systems}
    loads = []
    for _ in range(args.rounds):
        for name, size in systems.items():
            loads.append(os.getloadavg()[0])
            pool = VerifierPool(size)
            try:
                for phase in ("cold", "warm"):
                    seconds, matched = grade(pool, checks, args.threads)
                    timings[name][phase].append(seconds)
                    equal[name].add(matched)
            finally:
                pool.stop()
    rows = []
    for name in systems:
        row = {"system": name, "checks": len(checks), "threads": args.threads, "equal_verdicts": sorted(equal[name])}
        for phase, values in timings[name].items():
            row[f"{phase}_checks_per_s"] = len(checks) / statistics.median(values)
            row[f"{phase}_s_min"], row[f"{phase}_s_max"] = min(values), max(values)
        rows.append(row)
    before, after = rows
    gains = {phase: after[f"{phase}_checks_per_s"] / before[f"{phase}_checks_per_s"] for phase in ("cold", "warm")}
    print(f"gain: cold {gains['cold']:.2f}x, warm {gains['warm']:.2f}x")
    report(
        "grading",
        f"math-verify grading, {len(checks)} checks from {args.threads} threads, median of {args.rounds} rounds",
        ["system", "cold_checks_per_s", "cold_s_min", "cold_s_max", "warm_checks_per_s", "warm_s_min", "warm_s_max",
         "equal_verdicts"],
        rows,
        {"gain": gains, "load_average_1m": {"min": min(loads), "max": max(loads)}, "cpu_count": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
