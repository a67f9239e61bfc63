"""CPU generation benchmark (issue #19): today's `HFPolicy` against the `FastPolicy` default, same run.

Both decode the embedded SmolLM2-135M-Instruct from one shared module, with the same prompt (a chat
turn of ``--prompt-tokens`` tokens), the same sampling (temperature 1, seeded rows, no stop strings,
so every row makes exactly ``--new-tokens`` tokens) at batch 1 and batch 8. The systems alternate
over ``--rounds`` rounds (`_rounds.interleaved_rounds`: the order flips every round) so that load
swings hit both; the table gives medians with min-max and the load average beside each figure.

Also measured: the weight sync of one training step (a `FastPolicy.repack`: SmoothQuant calibration
pass plus int8 packing of the shared module, as after every update), folded into
``rapo_tokens_per_s_with_sync`` for a step of ``--step-tokens`` generated tokens; and the log-prob
difference of the fast path against the trained module on the fast path's own sequences.

Threads: every figure uses ``--threads`` torch threads (default 1) with ``OMP_WAIT_POLICY=PASSIVE``;
``--threads 1 2`` adds rows for both (on 2 shared cores under load, 2 threads collapse; see README).

Run: ``python benchmarks/generation.py`` (``--quick`` for a short run). Writes
``benchmarks/results/generation.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads starve the other processes
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from _report import report  # noqa: E402
from _rounds import interleaved_rounds, show, spread  # noqa: E402

from rapo_agents.policies import SamplingParams  # noqa: E402
from rapo_agents.policies.fast import FastPolicy  # noqa: E402
from rapo_agents.policies.hf import HFPolicy  # noqa: E402

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? Use the python tool to check your "
            "arithmetic, reason step by step, and give the final answer in \\boxed{}.")


def prompt_ids(tokenizer, length: int) -> list[int]:
    """A chat turn of exactly ``length`` tokens (the question repeated, then cut from the left)."""
    text = " ".join([QUESTION] * (1 + length // 40))
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                         add_generation_prompt=True), add_special_tokens=False)
    return ids[-length:]


def timed_generate(policy, context: list[int], batch: int, new_tokens: int, seed: int):
    params = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop=(), seed=seed * 100 + row)
              for row in range(batch)]
    started = time.perf_counter()
    generations = policy.generate([context] * batch, params)
    seconds = time.perf_counter() - started
    return sum(g.num_tokens for g in generations) / seconds, generations


def logprob_diffs(model, context: list[int], generations) -> torch.Tensor:
    """|rollout - trained module| log-prob of every generated token, teacher-forced."""
    diffs = []
    for generation in generations:
        ids = torch.tensor([context + generation.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits.float()[0], dim=-1)
        chosen = logprobs[len(context) - 1 : -1].gather(-1, torch.tensor(generation.token_ids)[:, None])
        diffs.append((torch.tensor(generation.logprobs) - chosen.squeeze(-1)).abs())
    return torch.cat(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per setting")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens generated per row")
    parser.add_argument("--prompt-tokens", type=int, default=160, help="prompt length in tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to measure")
    parser.add_argument("--step-tokens", type=int, default=2048,
                        help="generated tokens per training step (8 rollouts x 256) over which one sync is paid")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 24 tokens")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.new_tokens = 2, 24

    reference = HFPolicy.from_pretrained(device="cpu")
    fast = FastPolicy(reference.model, reference.tokenizer, threads=None)  # --threads decides, for both sides
    context = prompt_ids(reference.tokenizer, args.prompt_tokens)
    rows, summary = [], {}
    diffs: list[torch.Tensor] = []
    sync_seconds: list[float] = []

    def sync() -> float:
        started = time.perf_counter()
        fast.sync_weights(reference.model)  # what every training step pays (the module changed in place)
        sync_seconds.append(time.perf_counter() - started)
        return sync_seconds[-1]

    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            timed_generate(fast, context, batch, 4, seed=0)  # warm-up: allocator, kernels

            def rate(policy, batch=batch) -> float:
                tokens_per_s, generations = timed_generate(policy, context, batch, args.new_tokens, seed=1)
                if policy is fast and len(diffs) < len(args.batches):
                    diffs.append(logprob_diffs(reference.model, context, generations))
                return tokens_per_s

            results, loads = interleaved_rounds(
                {"baseline": lambda: rate(reference), "rapo": lambda: rate(fast), "sync": sync}, args.rounds)
            base, rapo = spread(results["baseline"]), spread(results["rapo"])
            with_sync = 1.0 / (1.0 / rapo["median"] + statistics.median(results["sync"]) / args.step_tokens)
            key = f"batch{batch}" + ("" if threads == 1 else f"_threads{threads}")
            summary[key] = {"baseline_tokens_per_s": base, "rapo_tokens_per_s": rapo,
                            "rapo_tokens_per_s_with_sync": with_sync, "ratio": rapo["median"] / base["median"],
                            "ratio_with_sync": with_sync / base["median"], "load_average": spread(loads)}
            rows.append({"threads": threads, "batch": batch, "baseline tok/s": show(base), "rapo tok/s": show(rapo),
                         "rapo+sync tok/s": round(with_sync, 1), "ratio": round(rapo["median"] / base["median"], 2),
                         "load avg": show(spread(loads))})
    all_diffs = torch.cat(diffs)
    extra = {
        "settings": {"rounds": args.rounds, "new_tokens": args.new_tokens, "prompt_tokens": len(context),
                     "sampling": "temperature 1, seeded rows, no stop strings", "threads": args.threads,
                     "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "step_tokens": args.step_tokens,
                     "rapo_engine": fast.name},
        "baseline_tokens_per_s": {k: v["baseline_tokens_per_s"]["median"] for k, v in summary.items()},
        "rapo_tokens_per_s": {k: v["rapo_tokens_per_s"]["median"] for k, v in summary.items()},
        "ratio": {k: v["ratio"] for k, v in summary.items()},
        "ratio_with_sync": {k: v["ratio_with_sync"] for k, v in summary.items()},
        "logprob_mean_abs_diff": float(all_diffs.mean()),
        "logprob_max_abs_diff": float(all_diffs.max()),
        "sync_seconds_per_step": spread(sync_seconds),
        "load_average": spread([v["load_average"]["median"] for v in summary.values()]),
        "details": summary,
    }
    report("generation", f"CPU generation, SmolLM2-135M: HFPolicy vs {fast.name} (medians, min-max)",
           ["threads", "batch", "baseline tok/s", "rapo tok/s", "rapo+sync tok/s", "ratio", "load avg"], rows, extra)
    print(f"log-prob |diff| mean {extra['logprob_mean_abs_diff']:.4f} max {extra['logprob_max_abs_diff']:.3f}; "
          f"sync {extra['sync_seconds_per_step']['median']:.2f} s/step")


if __name__ == "__main__":
    main()
