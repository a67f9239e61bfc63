"""``rapo env serve`` against the in-process env: steps/s and p50/p99 step latency at 1, 16 and 64 sessions.

The served side is a real ``rapo env serve RAPO-Math-v0`` process on loopback, played by OpenEnv's own async client
(`rapo_env.remote.RapoEnvClient`, one WebSocket session per episode stream, all in one event loop); the in-process
side is the same env (``gym.make``) stepped by as many threads, one env each, as the server runs its sessions. Both
use the shipped python sandbox (pooled warm workers; ``--sandbox subprocess`` for a fresh interpreter per call).

Two workloads, each episode a reset, three turns and an answer: ``python`` (each turn runs ``print(6 * 7)`` in the
sandbox) and ``text`` (turns with no tool call, answered by the env's hint: what serving adds to an env step shows
best there). Every (workload, sessions) cell runs both sides in interleaved rounds (`_rounds.interleaved_rounds`:
the order flips every round); figures are medians with min-max over the rounds, beside the load average. p99 over
a few hundred steps is the slowest step or two: read it as such.

Run: ``python benchmarks/env_server.py [--quick]``; writes ``benchmarks/results/env_server.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import httpx
import numpy as np

import rapo_env  # noqa: F401  (registers the envs)
from _report import report
from _rounds import interleaved_rounds, show, spread
from rapo_env.remote import RapoEnvClient
from rapo_tools.serving import free_port, serve_command

ENV_ID = "RAPO-Math-v0"
WORKLOADS = {
    "python": "<think>compute it</think>\n<python>print(6 * 7)</python>",
    "text": "<think>let me think about it some more</think>",
}
TURNS = 3  # then the answer: four steps per episode, within the env's three tool calls and five turns
ANSWER = "<answer>\\boxed{42}</answer>"
SESSIONS = (1, 16, 64)


def episode_actions(workload: str) -> list[str]:
    return [WORKLOADS[workload]] * TURNS + [ANSWER]


def in_process(env_kwargs: dict, workload: str, sessions: int, episodes: int) -> dict:
    """``sessions`` envs, each stepped by its own thread through ``episodes`` episodes."""
    envs = [gym.make(ENV_ID, **env_kwargs) for _ in range(sessions)]
    actions = episode_actions(workload)

    def play(index: int) -> list[float]:
        env, latencies = envs[index], []
        for episode in range(episodes):
            env.reset(seed=index, options={"task_index": (index + episode) % env_kwargs["num_tasks"]})
            for action in actions:
                started = time.perf_counter()
                env.step(action)
                latencies.append(time.perf_counter() - started)
        return latencies

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(sessions) as pool:
            latencies = [value for values in pool.map(play, range(sessions)) for value in values]
        wall = time.perf_counter() - started
    finally:
        for env in envs:
            env.close()
    return summary(latencies, wall)


def served(url: str, num_tasks: int, workload: str, sessions: int, episodes: int) -> dict:
    """``sessions`` OpenEnv sessions on the server, opened before the clock starts, each through ``episodes``
    episodes."""
    wait_until_no_session(url)
    actions = episode_actions(workload)

    async def run() -> tuple[list[float], float]:
        clients = [RapoEnvClient(base_url=url, message_timeout_s=600.0) for _ in range(sessions)]
        await asyncio.gather(*(client.connect() for client in clients))

        async def play(index: int) -> list[float]:
            client, latencies = clients[index], []
            for episode in range(episodes):
                await client.reset(seed=index, task_index=(index + episode) % num_tasks)
                for action in actions:
                    started = time.perf_counter()
                    await client.step(action)
                    latencies.append(time.perf_counter() - started)
            return latencies

        try:
            started = time.perf_counter()
            per_session = await asyncio.gather(*(play(index) for index in range(sessions)))
            wall = time.perf_counter() - started
        finally:
            await asyncio.gather(*(client.close() for client in clients))
        return [value for values in per_session for value in values], wall

    latencies, wall = asyncio.run(run())
    return summary(latencies, wall)


def wait_until_no_session(url: str, deadline_s: float = 120.0) -> None:
    """The last run's sessions are closed on the server (it closes an env after its client has gone)."""
    deadline = time.monotonic() + deadline_s
    while httpx.get(f"{url}/sessions").json()["open_envs"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the server still holds sessions of the last run")
        time.sleep(0.05)


def summary(latencies: list[float], wall: float) -> dict:
    return {"steps": len(latencies), "steps_per_s": len(latencies) / wall,
            "p50_ms": 1000 * float(np.percentile(latencies, 50)), "p99_ms": 1000 * float(np.percentile(latencies, 99))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds and fewer episodes: a couple of minutes")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per cell (default 5, 2 quick)")
    parser.add_argument("--sandbox", default="local", choices=("local", "subprocess"),
                        help="python sandbox backend of both sides (local: the shipped pooled workers)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    env_kwargs = {"num_tasks": 64, "sandbox": args.sandbox}
    port = free_port()
    command = [sys.executable, "-m", "rapo_cli", "env", "serve", ENV_ID, "--port", str(port), "--max-sessions",
               str(max(SESSIONS)), "--env-kwargs", json.dumps(env_kwargs)]
    load_before = os.getloadavg()
    rows = []
    with serve_command(command, port, startup_timeout_s=300) as url:
        for workload in WORKLOADS:  # warm-up: sandbox pools on both sides, imports, the server's first session
            in_process(env_kwargs, workload, 2, 1)
            served(url, env_kwargs["num_tasks"], workload, 2, 1)
        for workload in WORKLOADS:
            for sessions in SESSIONS:
                episodes = max(1, (8 if args.quick else 32) // sessions) * (1 if args.quick else 2)
                results, loads = interleaved_rounds({
                    "in-process": lambda w=workload, s=sessions, e=episodes: in_process(env_kwargs, w, s, e),
                    "served": lambda w=workload, s=sessions, e=episodes: served(url, env_kwargs["num_tasks"], w, s, e),
                }, rounds)
                local_rate = statistics.median(r["steps_per_s"] for r in results["in-process"])
                for system, runs in results.items():
                    rate = spread([r["steps_per_s"] for r in runs])
                    rows.append({
                        "workload": workload, "sessions": sessions, "system": system, "steps": runs[0]["steps"],
                        "steps_per_s": show(rate), "p50_ms": show(spread([r["p50_ms"] for r in runs]), 2),
                        "p99_ms": show(spread([r["p99_ms"] for r in runs]), 2),
                        "vs_in_process": round(rate["median"] / local_rate, 2), "load": show(spread(loads), 2),
                        "runs": runs,
                    })
    load_after = os.getloadavg()
    loads = "/".join(f"{value:.2f}" for value in load_before) + " before, " + \
        "/".join(f"{value:.2f}" for value in load_after) + " after"
    report("env_server", f"rapo env serve vs in-process {ENV_ID}: medians (min-max) over {rounds} interleaved rounds; "
           f"load average (1/5/15 min) {loads}",
           ["workload", "sessions", "system", "steps", "steps_per_s", "p50_ms", "p99_ms", "vs_in_process", "load"],
           rows, extra={"quick": args.quick, "rounds": rounds, "sandbox": args.sandbox, "cpus": os.cpu_count(),
                        "load_average_before": load_before, "load_average_after": load_after})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
