"""Ray column of the rollout benchmark: episodes/s of Ray rollout workers (1 and 2) against the local engine.

The workload is `benchmarks/rollout.py`'s scripted one (ScriptedPolicy on RAPO-Math-v0 with the real
python tool: two tool calls and an answer per episode). Every engine first plays one warm-up group,
so Ray's cluster and actor start-up (reported apart) is not counted in episodes/s. The baseline is
the local `RolloutEngine` with the same concurrency, in the same run.

Run: ``python benchmarks/rollout_ray.py`` (``--quick`` for a small run). Writes
``benchmarks/results/rollout_ray.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks._report import report  # noqa: E402
from benchmarks.rollout import ENV_KWARGS, TURNS  # noqa: E402
from rapo_agents.integrations.ray_rollout import make_rollout_engine  # noqa: E402
from rapo_agents.policies import ScriptedPolicy  # noqa: E402
from rapo_agents.rollout import RolloutConfig  # noqa: E402


def measure(backend: str, episodes: int, concurrency: int, **ray_options) -> dict:
    config = RolloutConfig(max_concurrent_episodes=concurrency, group_size=1)
    started = time.perf_counter()
    with make_rollout_engine(backend, "RAPO-Math-v0", ScriptedPolicy(TURNS), config, ENV_KWARGS,
                             **ray_options) as engine:
        engine.run([0])  # warm-up: actors, env pools, interpreter caches
        startup = time.perf_counter() - started
        trajectories = engine.run([q % 64 for q in range(episodes)])
        stats = engine.stats
    if not all(t.end_reason == "answer" for t in trajectories):
        raise RuntimeError(f"episodes did not finish with an answer: {[t.end_reason for t in trajectories]}")
    return {"episodes_per_s": episodes / stats.wall_s, "tool_calls_per_s": stats.tool_calls / stats.wall_s,
            "wall_s": stats.wall_s, "startup_s": startup}


def main(argv: list[str] | None = None) -> int:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run")
    args = parser.parse_args(argv)
    episodes, concurrency = (16, 8) if args.quick else (64, 16)
    local = measure("local", episodes, concurrency)
    rows = [{"engine": "local", "workers": 0, "episodes": episodes, **local, "ratio_vs_local": 1.0}]
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        for workers in (1, 2):
            # The same concurrency in all: each worker keeps concurrency / workers episodes in flight.
            result = measure("ray", episodes, max(1, concurrency // workers), num_workers=workers)
            rows.append({"engine": "ray", "workers": workers, "episodes": episodes, **result,
                         "ratio_vs_local": result["episodes_per_s"] / local["episodes_per_s"]})
    finally:
        ray.shutdown()
    columns = ["engine", "workers", "episodes", "episodes_per_s", "tool_calls_per_s", "wall_s", "startup_s",
               "ratio_vs_local"]
    report("rollout_ray", f"rollout engine: Ray workers vs local ({os.cpu_count()} CPUs, scripted policy, python tool)",
           columns, rows, extra={"quick": args.quick, "concurrency": concurrency})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
