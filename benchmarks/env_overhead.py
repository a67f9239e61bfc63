"""Env overhead per step (tool time excluded), single and vector envs, and python-tool throughput.

Run: ``python benchmarks/env_overhead.py [--quick]``. The step overhead is measured on turns
that call no tool (a malformed turn and an answer), so it is the env's own cost; the
tool throughput compares concurrency 8 against sequential calls of the same backend.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import gymnasium as gym

import rapo_env  # noqa: F401  (registers the envs)
from _report import report
from rapo_tools.python_tool import PythonTool

TOOL_FREE_TURNS = ("<think>let me think about it</think>", "<answer>\\boxed{1}</answer>")


def single_env_step_us(steps: int) -> float:
    env = gym.make("RAPO-Math-v0", num_tasks=32, sandbox="subprocess")
    env.reset(seed=0)
    timings = []
    for index in range(steps):
        action = TOOL_FREE_TURNS[index % 2]
        start = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        timings.append(time.perf_counter() - start - info["tool_latency_s"])
        if terminated or truncated:
            env.reset()
    env.close()
    return statistics.median(timings) * 1e6


def vector_env_step_us(mode: str, num_envs: int, steps: int) -> float:
    envs = gym.make_vec("RAPO-Math-v0", num_envs=num_envs, vectorization_mode=mode, num_tasks=32,
                        sandbox="subprocess")
    envs.reset(seed=0)
    timings = []
    for index in range(steps):
        start = time.perf_counter()
        envs.step([TOOL_FREE_TURNS[index % 2]] * num_envs)
        timings.append((time.perf_counter() - start) / num_envs)
    envs.close()
    return statistics.median(timings) * 1e6


def tool_calls_per_second(concurrency: int, calls: int) -> float:
    tool = PythonTool(sandbox="subprocess")

    async def run_all():
        semaphore = asyncio.Semaphore(concurrency)

        async def one(i):
            async with semaphore:
                return await tool.acall(f"print(sum(range({i} + 10**4)))")

        return await asyncio.gather(*(one(i) for i in range(calls)))

    start = time.perf_counter()
    results = asyncio.run(run_all())
    elapsed = time.perf_counter() - start
    tool.close()
    if not all(result.ok for result in results):
        raise RuntimeError("a benchmark tool call failed")
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    args = parser.parse_args()
    steps = 200 if args.quick else 2000
    rows = [
        {"setting": "single env", "median_us_per_step": single_env_step_us(steps)},
        {"setting": "sync vector x8", "median_us_per_step": vector_env_step_us("sync", 8, steps // 8)},
        {"setting": "async vector x8", "median_us_per_step": vector_env_step_us("async", 8, steps // 8)},
    ]
    calls = 40 if args.quick else 200
    sequential, concurrent = tool_calls_per_second(1, calls), tool_calls_per_second(8, calls)
    tool_rows = [
        {"setting": "subprocess tool, concurrency 1", "calls_per_s": sequential, "ratio": 1.0},
        {"setting": "subprocess tool, concurrency 8", "calls_per_s": concurrent, "ratio": concurrent / sequential},
    ]
    report("env_overhead", "Env step overhead (tool time excluded)", ["setting", "median_us_per_step"], rows,
           {"tool_throughput": tool_rows})
    report("env_overhead_tools", "Python tool throughput (subprocess backend)", ["setting", "calls_per_s", "ratio"],
           tool_rows)


if __name__ == "__main__":
    main()
