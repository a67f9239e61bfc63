"""Cost of the shipped held-out evaluation against per-turn batches and no prefix cache (issue #30, points 2 and 4).

The workload is what `make run` evaluates right after its warm-up: ``configs/default.yaml`` (SmolLM2-135M-Instruct
on procedural math, RAPO-Math-v0 with the python tool), its supervised warm-up run once, then the trainer's own
`HeldoutEvaluator` (greedy, the first ``--questions`` questions of the test split, the training engine and
policy). Systems, interleaved over ``--rounds`` rounds (`_rounds.interleaved_rounds`):

- ``cache off, batch 32, 1 thread, per turn``: every turn re-prefills its whole context (``prefix_cache_bytes=0``),
  each set of ready episodes decoded as one batch (``rollout.continuous_batching=false``) of at most the policy's
  own 32 rows on the rollouts' one thread (the evaluation before issue #30);
- ``shipped, per turn``: the default `PrefixCache` (`rapo_agents.policies.fast.DEFAULT_PREFIX_CACHE_BYTES`) and the
  evaluation's own decoding settings (`HeldoutConfig`: ``max_batch_size`` 64, ``threads`` None, the process's own,
  every core), each set of ready episodes still decoded as one batch to its longest row;
- ``shipped``: the same with the continuous batch (`rapo_agents.policies.continuous`): an episode rejoins the
  running batch ``rollout.rejoin_delay_steps`` decode steps after its turn ended (so the run repeats exactly), and
  leaves when its turn ends;
- ``shipped, rejoin when the tool returns``: the same, joining as soon as the tool returns
  (``rejoin_delay_steps=None``, what the continuous batch did before the delay; its tokens depend on tool timing).

Reported per system: eval wall time, prompt tokens prefilled and reused per episode, the time inside
``generate`` and in env steps, generated tokens per episode and the accuracy (which must not move: the shipped
evaluation decodes fp32, where caching and batching are exact; int8 moves with them). Figures are medians with
min-max, beside the load average and the CPU model; `benchmarks/results/eval_cost.json` (``eval_cost_<format>.json``
for another format) gets them all.

Run: ``nice -n 10 python benchmarks/eval_cost.py`` (``--quick``: 24 questions, 2 rounds; ``--weight-format int8``
for the faster, lossy evaluation).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see tests/conftest.py: spinning threads on a busy machine

from _machine import cpu_facts
from _report import CONFIGS, report
from _rounds import interleaved_rounds, show, spread
from _warm import warmed_up_trainer
from rapo_agents.heldout import HeldoutConfig
from rapo_agents.policies.fast import DEFAULT_PREFIX_CACHE_BYTES
from rapo_agents.policies.llama_decoder import WEIGHT_FORMATS
from rapo_agents.policies.prefix_cache import PrefixCache
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.trainer import RAPOTrainer

SHIPPED = HeldoutConfig()
DELAY = RolloutConfig().rejoin_delay_steps
SYSTEMS = {"cache off, batch 32, 1 thread, per turn": (0, 32, 1, False, DELAY),
           "shipped, per turn": (DEFAULT_PREFIX_CACHE_BYTES, SHIPPED.max_batch_size, SHIPPED.threads, False, DELAY),
           "shipped": (DEFAULT_PREFIX_CACHE_BYTES, SHIPPED.max_batch_size, SHIPPED.threads, True, DELAY),
           "shipped, rejoin when the tool returns": (DEFAULT_PREFIX_CACHE_BYTES, SHIPPED.max_batch_size,
                                                     SHIPPED.threads, True, None)}
"""name -> (prefix cache bytes, evaluation max_batch_size, evaluation threads, continuous batching, rejoin delay)."""


def evaluate(trainer: RAPOTrainer, cache_bytes: int, batch_size: int, threads: int | None, continuous: bool,
             rejoin_delay_steps: int | None) -> dict:
    """One held-out evaluation with a fresh prefix store of ``cache_bytes``, decoding ``batch_size`` rows at once on
    ``threads``, as a continuous batch (episodes rejoining ``rejoin_delay_steps`` after their turn) or per turn; its
    cost per episode."""
    evaluator = trainer.heldout
    policy = evaluator.engine.policy
    policy.prefix_cache = PrefixCache(cache_bytes)
    evaluator.config = dataclasses.replace(evaluator.config, max_batch_size=batch_size, threads=threads)
    evaluator.engine.config = dataclasses.replace(evaluator.engine.config, continuous_batching=continuous,
                                                  rejoin_delay_steps=rejoin_delay_steps)
    before = policy.prefill_stats.as_dict()
    result = evaluator.evaluate(0, show_progress=False)
    stats, after = evaluator.engine.stats, policy.prefill_stats.as_dict()
    episodes = len(result.correct)
    return {
        "wall_s": result.metrics["time/eval_s"],
        "prompt_tokens": (after["prompt_tokens"] - before["prompt_tokens"]) / episodes,
        "prefilled_tokens": (after["prefilled_tokens"] - before["prefilled_tokens"]) / episodes,
        "reused_tokens": (after["reused_tokens"] - before["reused_tokens"]) / episodes,
        "generate_s": stats.generate_s, "env_step_s": stats.env_step_s, "tool_wait_s": stats.wait_s,
        "generate_calls": stats.generate_calls,
        "generated_tokens": stats.generated_tokens / episodes,
        "accuracy": result.metrics["eval/accuracy"], "tool_calls": result.metrics["eval/tool_calls"],
        "correct": result.correct,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=100, help="held-out questions (the default run's 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="24 questions, 2 rounds")
    parser.add_argument("--weight-format", choices=WEIGHT_FORMATS, default=None,
                        help="evaluate in this FastPolicy format (default: the shipped evaluation's, "
                             f"{SHIPPED.weight_format}); fp32 shows that caching leaves every verdict as it was")
    args = parser.parse_args()
    questions, rounds = (24, 2) if args.quick else (args.questions, args.rounds)
    with tempfile.TemporaryDirectory() as output_dir:
        # retrieval off: evaluation never retrieves
        trainer = warmed_up_trainer(CONFIGS / "default.yaml", output_dir, [
            "retrieval.enabled=false", f"evaluation.heldout_tasks={questions}",
            *([f"evaluation.weight_format={args.weight_format}"] if args.weight_format else [])])
        print(f"policy {trainer.heldout.engine.policy.name}, {questions} held-out questions, {rounds} rounds")
        results, loads = interleaved_rounds(
            {name: lambda b=bytes_, s=size, t=threads, c=continuous, d=delay: evaluate(trainer, b, s, t, c, d)
             for name, (bytes_, size, threads, continuous, delay) in SYSTEMS.items()},
            rounds)
        trainer.heldout.close()
    reference = results[next(iter(SYSTEMS))][0]["correct"]
    rows = []
    for name, runs in results.items():
        figures = {key: spread([run[key] for run in runs]) for key in runs[0] if key != "correct"}
        agree = min(sum(a == b for a, b in zip(run["correct"], reference, strict=True)) for run in runs)
        rows.append({"system": name, "eval s": show(figures["wall_s"]),
                     "prompt tok/episode": show(figures["prompt_tokens"], 0),
                     "prefilled tok/episode": show(figures["prefilled_tokens"], 0),
                     "reused tok/episode": show(figures["reused_tokens"], 0),
                     "generate s": show(figures["generate_s"]), "env step s": show(figures["env_step_s"]),
                     "tool wait s": show(figures["tool_wait_s"]),
                     "generate calls or steps": show(figures["generate_calls"], 0),
                     "generated tok/episode": show(figures["generated_tokens"], 0),
                     "accuracy": show(figures["accuracy"], 3), "same verdicts": f"{agree}/{len(reference)}",
                     "figures": figures})
    load = spread(loads)
    cpu = cpu_facts()["model"]
    columns = [c for c in rows[0] if c != "figures"]
    name = "eval_cost" if args.weight_format in (None, SHIPPED.weight_format) else f"eval_cost_{args.weight_format}"
    report(name, f"held-out eval of configs/default.yaml after its warm-up, {questions} questions, "
           f"{rounds} rounds, load {show(load, 2)}, {cpu}", columns, rows,
           {"cpu_model": cpu, "load_average": load, "questions": questions, "rounds": rounds,
            "policy": trainer.heldout.engine.policy.name, "threads": trainer.heldout.engine.policy.threads})


if __name__ == "__main__":
    main()
