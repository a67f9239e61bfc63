"""Rollout engine benchmark: engine and tool overhead, HF decoding speed, and overlap of tools with generation.

Four parts, each against a baseline measured in the same run. Every env uses the shipped
defaults (the pooled python sandbox, not ``sandbox="subprocess"``), and every comparison is
interleaved over ``--rounds`` rounds (`_rounds.interleaved_rounds`: the order flips every round), so
a load swing hits both sides; figures are medians with min-max, beside the load average.

1. ScriptedPolicy on RAPO-Math-v0 with the real python tool (two tool calls and an answer per
   episode) at 1, 8 and 64 concurrent episodes: episodes/s and tool calls/s of the engine
   (overlap, 16 tool threads) against a naive loop (strict rounds, tools one after another).
2. The shipped CPU policy (`policy_for_model`: `FastPolicy` on SmolLM2-135M-Instruct): generated
   tokens/s with a batch of 8 against batch 1 (``benchmarks/generation.py`` compares it with HFPolicy).
3. Share of wall time spent generating, engine against naive loop, for episodes whose turns are
   paced by real SmolLM2 decoding (each scripted turn costs a batched decode of 8/16 tokens) and
   whose tool calls take ~1 s (like a web search or page fetch).
4. The Ray column: part 1's scripted workload on Ray rollout workers (1 and 2; `rapo_agents.backends.make_engine`)
   against the local engine at the same concurrency. Every engine first plays one warm-up group, so
   Ray's cluster and actor start-up (reported apart) is not counted in episodes/s. Skipped with
   ``--no-ray`` or when the ``[ray]`` extra is missing.
5. Repeatability: the rollout policy of ``configs/qa.yaml`` after its warm-up (`_warm`) playing its knowledge-base
   questions (its env, search tool and rollout settings), each run from an empty prefix cache as a fresh process
   starts: episodes rejoining the running batch ``rollout.rejoin_delay_steps`` decode steps after their turn
   (shipped) against rejoining as soon as their tool returns, on torch's default threads as `rapo train` decodes
   (not ``--threads``: how often a tool returns after the next decode step depends on it). Wall time, waits for
   late tools, and how many episodes repeat the system's first round to the last bit (tokens and log-probs).

Run: ``python benchmarks/rollout.py`` (``--quick`` for a small run, ``--parts 5`` for one part). Writes
``benchmarks/results/rollout.json`` and ``rollout.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _machine import cpu_facts
from _report import CONFIGS, RESULTS_DIR, report
from _rounds import interleaved_rounds, show, spread
from rapo_agents.policies import SamplingParams, ScriptedPolicy
from rapo_agents.rollout import RolloutConfig, RolloutEngine

TURNS = [
    "<think>first part</think>\n<python>\nx = 6 * 7\nprint(x)\n</python>",
    "<think>check it</think>\n<python>\nprint(42 + 0)\n</python>",
    "<answer>\\boxed{42}</answer>",
]
SLOW_TURNS = [
    "<think>query a slow tool</think>\n<python>\nimport time\ntime.sleep(1.0)\nprint(6 * 7)\n</python>",
    "<answer>\\boxed{42}</answer>",
]
ENV_KWARGS = {"num_tasks": 64, "max_tool_calls": 3}  # the shipped sandbox (pooled workers)


def engine_config(concurrency: int, naive: bool, **extra) -> RolloutConfig:
    return RolloutConfig(max_concurrent_episodes=concurrency, overlap=not naive, tool_workers=1 if naive else 16,
                         **extra)


def run_engine(policy, episodes: int, config: RolloutConfig) -> dict:
    with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs=ENV_KWARGS) as engine:
        engine.run([0])  # warm the env pool and the interpreter caches
        trajectories = engine.run([q % 64 for q in range(episodes)])
        stats = engine.stats.as_dict()
    assert all(t.end_reason == "answer" for t in trajectories), [t.end_reason for t in trajectories]
    return stats


def measure_engine(backend: str, episodes: int, concurrency: int, num_workers: int = 1) -> dict:
    """Episodes/s of the scripted workload on the ``backend`` engine (`make_engine`), after one warm-up group."""
    from rapo_agents.backends import make_engine
    from rapo_agents.config import RayConfig

    config = RolloutConfig(backend=backend, max_concurrent_episodes=concurrency, rollout_n=1)
    started = time.perf_counter()
    with make_engine("RAPO-Math-v0", ScriptedPolicy(TURNS), config, ENV_KWARGS,
                     ray=RayConfig(num_workers=num_workers)) as engine:
        engine.run([0])  # warm-up: actors, env pools, interpreter caches
        startup = time.perf_counter() - started
        trajectories = engine.run([q % 64 for q in range(episodes)])
        stats = engine.stats
    if not all(t.end_reason == "answer" for t in trajectories):
        raise RuntimeError(f"episodes did not finish with an answer: {[t.end_reason for t in trajectories]}")
    return {"engine_episodes_per_s": episodes / stats.wall_s,
            "engine_tool_calls_per_s": stats.tool_calls / stats.wall_s, "wall_s": stats.wall_s, "startup_s": startup}


def part_ray(quick: bool, rounds: int) -> list[dict]:
    """Ray rollout workers (1 and 2) against the local engine, the same total concurrency in all, interleaved."""
    import ray

    episodes, concurrency = (16, 8) if quick else (64, 16)
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        systems = {"local": lambda: measure_engine("local", episodes, concurrency)}
        for workers in (1, 2):
            systems[f"ray{workers}"] = lambda workers=workers: measure_engine(
                "ray", episodes, max(1, concurrency // workers), num_workers=workers)
        results, loads = interleaved_rounds(systems, rounds)
    finally:
        ray.shutdown()
    local = spread([r["engine_episodes_per_s"] for r in results["local"]])
    rows = []
    for name, runs in results.items():
        rate = spread([r["engine_episodes_per_s"] for r in runs])
        rows.append({"part": "ray", "engine": "local" if name == "local" else "ray",
                     "workers": 0 if name == "local" else int(name[3:]), "concurrency": concurrency,
                     "episodes": episodes, "engine_episodes_per_s": show(rate, 2),
                     "startup_s": show(spread([r["startup_s"] for r in runs]), 2),
                     "speedup": round(rate["median"] / local["median"], 2), "load": show(spread(loads)),
                     "runs": runs})
    return rows


def part_overhead(quick: bool, rounds: int) -> list[dict]:
    rows = []
    policy = ScriptedPolicy(TURNS)
    for concurrency in (1, 8, 64):
        episodes = max(4, concurrency) if quick else max(8, 2 * concurrency)
        results, loads = interleaved_rounds({
            name: lambda naive=naive, episodes=episodes, concurrency=concurrency: run_engine(
                policy, episodes, engine_config(concurrency, naive=naive))
            for name, naive in (("engine", False), ("naive", True))
        }, rounds)
        engine = spread([r["episodes_per_s"] for r in results["engine"]])
        naive = spread([r["episodes_per_s"] for r in results["naive"]])
        ratios = spread([e["episodes_per_s"] / n["episodes_per_s"]
                         for e, n in zip(results["engine"], results["naive"], strict=True)])
        rows.append({
            "part": "scripted overhead", "concurrency": concurrency, "episodes": episodes,
            "engine_episodes_per_s": show(engine, 2),
            "engine_tool_calls_per_s": show(spread([r["tool_calls_per_s"] for r in results["engine"]]), 2),
            "naive_episodes_per_s": show(naive, 2), "speedup": show(ratios, 2), "load": show(spread(loads)),
            "engine_median": engine["median"], "naive_median": naive["median"],
        })
    return rows


def load_smollm2():
    """The policy `rapo train` and `rapo eval` decode with on CPU (`FastPolicy` over the embedded SmolLM2)."""
    from rapo_agents.policies.factory import make_policy

    return make_policy("hf", device="cpu", max_batch_size=16)


def part_tokens(policy, quick: bool, rounds: int) -> list[dict]:
    tokenizer = policy.tokenizer
    new_tokens = 16 if quick else 32
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Explain why 6 * 7 = 42."}],
                                           tokenize=False, add_generation_prompt=True)
    context = tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop=(), seed=0)
    policy.generate([context], params.replace(max_new_tokens=2))  # warm-up

    def tokens_per_s(batch: int) -> float:
        started = time.perf_counter()
        generations = policy.generate([context] * batch, [params.replace(seed=i) for i in range(batch)])
        return sum(g.num_tokens for g in generations) / (time.perf_counter() - started)

    results, loads = interleaved_rounds({"1": lambda: tokens_per_s(1), "8": lambda: tokens_per_s(8)}, rounds)
    batch1, batch8 = spread(results["1"]), spread(results["8"])
    return [{"part": f"{policy.name} tokens/s", "batch1_tokens_per_s": show(batch1),
             "batch8_tokens_per_s": show(batch8), "speedup": round(batch8["median"] / batch1["median"], 2),
             "new_tokens": new_tokens, "load": show(spread(loads))}]


class ModelPacedPolicy(ScriptedPolicy):
    """Scripted turns whose generation costs real decoding: the model decodes ``pace_tokens`` tokens per turn."""

    def __init__(self, turns, model_policy, pace_tokens: int):
        super().__init__(turns, tokenizer=model_policy.tokenizer)
        self.model_policy = model_policy
        self.pace_tokens = pace_tokens

    def generate(self, contexts, sampling):
        generations = super().generate(contexts, sampling)
        self.model_policy.generate(
            contexts, [SamplingParams(temperature=1.0, max_new_tokens=self.pace_tokens, stop=(), seed=i)
                       for i in range(len(contexts))])
        return generations


def part_overlap(model_policy, quick: bool, rounds: int) -> list[dict]:
    pace_tokens = 8 if quick else 16
    policy = ModelPacedPolicy(SLOW_TURNS, model_policy, pace_tokens)
    episodes = 4 if quick else 8

    def run(naive: bool) -> dict:
        config = engine_config(episodes, naive=naive, max_prompt_tokens=2048)
        with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs=ENV_KWARGS) as engine:
            trajectories = engine.run(list(range(episodes)))
            stats = engine.stats.as_dict()
        if not all(t.num_tool_calls == 1 for t in trajectories):
            raise RuntimeError(f"expected one tool call per episode: {[t.num_tool_calls for t in trajectories]}")
        return stats

    results, loads = interleaved_rounds({"engine": lambda: run(False), "naive": lambda: run(True)}, rounds)
    naive_walls = [r["wall_s"] for r in results["naive"]]
    rows = []
    for name, runs in results.items():
        rows.append({"part": f"generation share ({name})", "episodes": episodes, "pace_tokens": pace_tokens,
                     "wall_s": show(spread([r["wall_s"] for r in runs]), 2),
                     "generate_s": show(spread([r["generate_s"] for r in runs]), 2),
                     "tool_wait_s": show(spread([r["wait_s"] for r in runs]), 2),
                     "generation_share": show(spread([r["generation_share"] for r in runs]), 2),
                     # the ratio of each round's pair, so a load swing between rounds cancels out
                     "speedup": show(spread([n / r["wall_s"] for n, r in zip(naive_walls, runs, strict=True)]), 2),
                     "load": show(spread(loads)),
                     "wall_median": statistics.median(r["wall_s"] for r in runs),
                     "generate_median": statistics.median(r["generate_s"] for r in runs)})
    return rows


def part_repeat(quick: bool, rounds: int) -> list[dict]:
    import tempfile

    from _warm import warmed_up_trainer
    from rapo_agents.trainer import training_env_kwargs

    questions = 4 if quick else 16
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = warmed_up_trainer(CONFIGS / "qa.yaml", output_dir, ["retrieval.enabled=false"])
        trainer.close()  # only its policy plays here
    config, policy = trainer.config, trainer.policy
    env_kwargs = training_env_kwargs(config)

    def run(rejoin_delay_steps: int | None) -> dict:
        policy.prefix_cache.clear()  # what a fresh process starts from
        rollout = dataclasses.replace(config.rollout, rejoin_delay_steps=rejoin_delay_steps)
        with RolloutEngine(config.data.env_id, policy, rollout, env_kwargs=env_kwargs) as engine:
            trajectories = engine.run(list(range(questions)), seed=7)
            return {**engine.stats.as_dict(), "episodes": [(t.token_ids, t.logprobs) for t in trajectories]}

    shipped = RolloutConfig().rejoin_delay_steps
    systems = {f"rejoin {shipped} steps after the turn (shipped)": lambda: run(shipped),
               "rejoin when the tool returns": lambda: run(None)}
    results, loads = interleaved_rounds(systems, rounds)
    rows = []
    for name, runs in results.items():
        first = runs[0]["episodes"]
        repeats = [sum(a == b for a, b in zip(first, r["episodes"], strict=True)) for r in runs[1:]]
        rows.append({"part": f"repeatability ({name})", "engine": policy.name, "episodes": len(first),
                     "tool_calls": show(spread([r["tool_calls"] for r in runs]), 0),
                     "wall_s": show(spread([r["wall_s"] for r in runs]), 2),
                     "generate_s": show(spread([r["generate_s"] for r in runs]), 2),
                     "tool_wait_s": show(spread([r["wait_s"] for r in runs]), 2),
                     "repeats_first_round": " ".join(f"{count}/{len(first)}" for count in repeats),
                     "load": show(spread(loads))})
    return rows


def plot(rows: list[dict]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    overhead = [r for r in rows if r["part"] == "scripted overhead"]
    shares = [r for r in rows if r["part"].startswith("generation share")]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(overhead))
    left.bar([x - 0.2 for x in xs], [r["engine_median"] for r in overhead], 0.4, label="engine")
    left.bar([x + 0.2 for x in xs], [r["naive_median"] for r in overhead], 0.4, label="naive loop")
    left.set_xticks(list(xs), [str(r["concurrency"]) for r in overhead])
    left.set_xlabel("concurrent episodes")
    left.set_ylabel("median episodes/s (ScriptedPolicy, pooled python tool)")
    left.legend()
    right.bar([r["part"].split("(")[1].rstrip(")") for r in shares], [r["wall_median"] for r in shares], label="wall")
    right.bar([r["part"].split("(")[1].rstrip(")") for r in shares], [r["generate_median"] for r in shares],
              label="generation")
    right.set_ylabel("median seconds (SmolLM2-paced turns, 1 s tools)")
    right.legend()
    figure.tight_layout()
    path = RESULTS_DIR / "rollout.png"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


PARTS = frozenset({1, 2, 3, 4, 5})


def parse_parts(text: str) -> frozenset[int]:
    """``--parts``: comma-separated part numbers of `PARTS`."""
    try:
        parts = frozenset(int(part) for part in text.split(","))
    except ValueError:
        parts = frozenset({0})
    if not parts or not parts <= PARTS:
        raise argparse.ArgumentTypeError(f"expected part numbers from {sorted(PARTS)} joined by commas, got {text!r}")
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 avoids OpenMP spin contention when other processes share the cores "
                             "(on a busy 2-core machine SmolLM2 decodes ~6x faster with 1 thread than with 2)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray column (part 4)")
    parser.add_argument("--parts", type=parse_parts, default=PARTS, help="which parts to run, comma-separated, "
                                                                         "e.g. 5 (default: all)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison (default 3, "
                                                                 "2 with --quick)")
    args = parser.parse_args(argv)
    import torch

    parts = args.parts
    training_threads = torch.get_num_threads()  # what `rapo train` decodes on: torch's own default
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (2 if args.quick else 3)
    rows = part_overhead(args.quick, rounds) if 1 in parts else []
    model_policy = load_smollm2() if parts & {2, 3} else None
    rows += part_tokens(model_policy, args.quick, rounds) if 2 in parts else []
    rows += part_overlap(model_policy, args.quick, rounds) if 3 in parts else []
    if 4 not in parts or args.no_ray or importlib.util.find_spec("ray") is None:
        print("Ray column skipped (--no-ray, --parts without 4, or the [ray] extra is not installed)")
    else:
        rows += part_ray(args.quick, rounds)
    if 5 in parts:
        torch.set_num_threads(training_threads)
        rows += part_repeat(args.quick, rounds)
    columns = ["part", "engine", "workers", "concurrency", "episodes", "engine_episodes_per_s",
               "engine_tool_calls_per_s", "naive_episodes_per_s", "batch1_tokens_per_s", "batch8_tokens_per_s",
               "tool_calls", "wall_s", "startup_s", "generate_s", "tool_wait_s", "generation_share", "speedup",
               "repeats_first_round", "load"]
    picture = plot(rows)
    cpu = cpu_facts()["model"]
    report("rollout", f"rollout engine: medians (min-max) over {rounds} interleaved rounds, load average beside, "
           f"{cpu}", columns, rows,
           extra={"cpu_model": cpu, "quick": args.quick, "rounds": rounds, "torch_threads": args.threads,
                  "torch_threads_part_5": training_threads, "parts": sorted(parts),
                  "sandbox": "shipped default (pooled)", "plot": str(picture) if picture else None})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
