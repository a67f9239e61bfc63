"""Rollout engine benchmark: engine and tool overhead, HF decoding speed, and overlap of tools with generation.

Four parts, each against a baseline measured in the same run:

1. ScriptedPolicy on RAPO-Math-v0 with the real python tool (two tool calls and an answer per
   episode) at 1, 8 and 64 concurrent episodes: episodes/s and tool calls/s of the engine
   (overlap, 16 tool threads) against a naive loop (strict rounds, tools one after another).
2. HFPolicy on SmolLM2-135M-Instruct: generated tokens/s with a batch of 8 against batch 1.
3. Share of wall time spent generating, engine against naive loop, for episodes whose turns are
   paced by real SmolLM2 decoding (each scripted turn costs a batched decode of 8/16 tokens) and
   whose tool calls take ~1 s (like a web search or page fetch).
4. The Ray column: part 1's scripted workload on Ray rollout workers (1 and 2; `make_rollout_engine`)
   against the local engine at the same concurrency. Every engine first plays one warm-up group, so
   Ray's cluster and actor start-up (reported apart) is not counted in episodes/s. Skipped with
   ``--no-ray`` or when the ``[ray]`` extra is missing.

Run: ``python benchmarks/rollout.py`` (``--quick`` for a small run). Writes
``benchmarks/results/rollout.json`` and ``rollout.png``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _report import RESULTS_DIR, report
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
ENV_KWARGS = {"num_tasks": 64, "sandbox": "subprocess", "max_tool_calls": 3}


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


def measure_engine(backend: str, episodes: int, concurrency: int, **ray_options) -> dict:
    """Episodes/s of the scripted workload on ``make_rollout_engine(backend, ...)``, after one warm-up group."""
    from rapo_agents.integrations.ray_rollout import make_rollout_engine

    config = RolloutConfig(max_concurrent_episodes=concurrency, rollout_n=1)
    started = time.perf_counter()
    with make_rollout_engine(backend, "RAPO-Math-v0", ScriptedPolicy(TURNS), config, ENV_KWARGS,
                             **ray_options) as engine:
        engine.run([0])  # warm-up: actors, env pools, interpreter caches
        startup = time.perf_counter() - started
        trajectories = engine.run([q % 64 for q in range(episodes)])
        stats = engine.stats
    if not all(t.end_reason == "answer" for t in trajectories):
        raise RuntimeError(f"episodes did not finish with an answer: {[t.end_reason for t in trajectories]}")
    return {"engine_episodes_per_s": episodes / stats.wall_s,
            "engine_tool_calls_per_s": stats.tool_calls / stats.wall_s, "wall_s": stats.wall_s, "startup_s": startup}


def part_ray(quick: bool) -> list[dict]:
    """Ray rollout workers (1 and 2) against the local engine, the same total concurrency in all."""
    import ray

    episodes, concurrency = (16, 8) if quick else (64, 16)
    local = measure_engine("local", episodes, concurrency)
    rows = [{"part": "ray", "engine": "local", "workers": 0, "concurrency": concurrency, "episodes": episodes,
             **local, "speedup": 1.0}]
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        for workers in (1, 2):
            result = measure_engine("ray", episodes, max(1, concurrency // workers), num_workers=workers)
            rows.append({"part": "ray", "engine": "ray", "workers": workers, "concurrency": concurrency,
                         "episodes": episodes, **result,
                         "speedup": result["engine_episodes_per_s"] / local["engine_episodes_per_s"]})
    finally:
        ray.shutdown()
    return rows


def part_overhead(quick: bool) -> list[dict]:
    rows = []
    policy = ScriptedPolicy(TURNS)
    for concurrency in (1, 8, 64):
        episodes = max(4, concurrency) if quick else max(8, 2 * concurrency)
        engine = run_engine(policy, episodes, engine_config(concurrency, naive=False))
        naive = run_engine(policy, episodes, engine_config(concurrency, naive=True))
        rows.append({
            "part": "scripted overhead", "concurrency": concurrency, "episodes": episodes,
            "engine_episodes_per_s": engine["episodes_per_s"], "engine_tool_calls_per_s": engine["tool_calls_per_s"],
            "naive_episodes_per_s": naive["episodes_per_s"], "naive_tool_calls_per_s": naive["tool_calls_per_s"],
            "speedup": engine["episodes_per_s"] / naive["episodes_per_s"],
        })
    return rows


def load_smollm2():
    from rapo_agents.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(device="cpu", max_batch_size=16)


def part_tokens(policy, quick: bool) -> list[dict]:
    tokenizer = policy.tokenizer
    new_tokens = 16 if quick else 32
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Explain why 6 * 7 = 42."}],
                                           tokenize=False, add_generation_prompt=True)
    context = tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop=(), seed=0)
    policy.generate([context], params.replace(max_new_tokens=2))  # warm-up
    rows = {}
    for batch in (1, 8):
        started = time.perf_counter()
        generations = policy.generate([context] * batch, [params.replace(seed=i) for i in range(batch)])
        seconds = time.perf_counter() - started
        rows[batch] = sum(g.num_tokens for g in generations) / seconds
    return [{"part": "HFPolicy SmolLM2 tokens/s", "batch1_tokens_per_s": rows[1], "batch8_tokens_per_s": rows[8],
             "speedup": rows[8] / rows[1], "new_tokens": new_tokens}]


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


def part_overlap(model_policy, quick: bool) -> list[dict]:
    pace_tokens = 8 if quick else 16
    policy = ModelPacedPolicy(SLOW_TURNS, model_policy, pace_tokens)
    episodes = 4 if quick else 8
    rows = []
    results = {}
    for name, naive in (("engine", False), ("naive", True)):
        config = engine_config(episodes, naive=naive, max_prompt_tokens=2048)
        with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs=ENV_KWARGS) as engine:
            trajectories = engine.run(list(range(episodes)))
            results[name] = engine.stats.as_dict()
        assert all(t.num_tool_calls == 1 for t in trajectories)
    for name, stats in results.items():
        rows.append({"part": f"generation share ({name})", "episodes": episodes, "pace_tokens": pace_tokens,
                     "wall_s": stats["wall_s"],
                     "generate_s": stats["generate_s"], "tool_wait_s": stats["wait_s"],
                     "generation_share": stats["generation_share"],
                     "speedup": results["naive"]["wall_s"] / stats["wall_s"]})
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
    left.bar([x - 0.2 for x in xs], [r["engine_episodes_per_s"] for r in overhead], 0.4, label="engine")
    left.bar([x + 0.2 for x in xs], [r["naive_episodes_per_s"] for r in overhead], 0.4, label="naive loop")
    left.set_xticks(list(xs), [str(r["concurrency"]) for r in overhead])
    left.set_xlabel("concurrent episodes")
    left.set_ylabel("episodes/s (ScriptedPolicy, real python tool)")
    left.legend()
    right.bar([r["part"].split("(")[1].rstrip(")") for r in shares], [r["wall_s"] for r in shares], label="wall")
    right.bar([r["part"].split("(")[1].rstrip(")") for r in shares], [r["generate_s"] for r in shares],
              label="generation")
    right.set_ylabel("seconds (SmolLM2-paced turns, 1 s tools)")
    right.legend()
    figure.tight_layout()
    path = RESULTS_DIR / "rollout.png"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 avoids OpenMP spin contention when other processes share the cores "
                             "(on a busy 2-core machine SmolLM2 decodes ~6x faster with 1 thread than with 2)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray column (part 4)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = part_overhead(args.quick)
    model_policy = load_smollm2()
    rows += part_tokens(model_policy, args.quick)
    rows += part_overlap(model_policy, args.quick)
    if args.no_ray or importlib.util.find_spec("ray") is None:
        print("Ray column skipped (--no-ray, or the [ray] extra is not installed)")
    else:
        rows += part_ray(args.quick)
    columns = ["part", "engine", "workers", "concurrency", "episodes", "engine_episodes_per_s",
               "engine_tool_calls_per_s", "naive_episodes_per_s", "batch1_tokens_per_s", "batch8_tokens_per_s",
               "wall_s", "startup_s", "generate_s", "tool_wait_s", "generation_share", "speedup"]
    picture = plot(rows)
    report("rollout", "rollout engine (ratios are against the baseline of the same row)", columns, rows,
           extra={"quick": args.quick, "torch_threads": args.threads, "plot": str(picture) if picture else None})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
