"""CPU generation benchmark (issues #19, #30): `HFPolicy`, the `FastPolicy` default and CTranslate2 int8, same run.

What it measures, on the embedded SmolLM2-135M-Instruct (one shared module, the same weights for every engine):

- **Throughput.** The same prompt (a chat turn of ``--prompt-tokens`` tokens) and sampling (temperature 1, full
  vocabulary, seeded rows, no stop strings or end token, so every row makes exactly ``--new-tokens`` tokens) at
  batch 1 and 8, prefill included, for ``HFPolicy`` (transformers), ``FastPolicy`` (int8 `LlamaDecoder`, prefix
  cache off so that every call prefills its whole prompt) and the anchor, CTranslate2 int8 (``ctranslate2.Generator``
  on a conversion of the same folder, ``compute_type="int8"``, ``intra_threads=--threads``). Time to first token
  (a 1-token generation: the prefill plus one sample) is measured beside each, and a decode-only rate is derived
  from the two. The systems alternate over ``--rounds`` rounds (`_rounds.interleaved_rounds`: the order flips every
  round) so that load swings hit all of them; the table gives medians with min-max and the load average.
  Without ``ctranslate2`` installed (``pip install -e '.[ct2]'``) the anchor is skipped, and the output says so.
- **The bandwidth-bound limit of this machine.** One core's read bandwidth (the best of a few sums of a float32
  tensor 4x the last-level cache, and of one the size of the decode working set, in every round beside the
  engines; the best over the rounds counts, since other processes' memory traffic lowers the rest), and the
  bytes a batch-1 decode step streams: every tensor `LlamaDecoder` keeps for its matmuls and norms (int8
  payloads, the float sums and norms, one embedding row), read from its actual storage. Limit tok/s = bandwidth /
  bytes per token; each engine's batch-1 rate is given as a fraction of it (all-in, and decode-only).
- **The CPU.** Model name, ISA flags (AVX2, AVX-512, VNNI, AMX), ``torch.backends.cpu.get_cpu_capability()`` and
  the ISA environment knobs, printed with every table and stored in the JSON. ``--fbgemm-isa AVX2`` sets
  ``FBGEMM_ENABLE_INSTRUCTIONS`` (fbgemm reads it once, when ``import torch`` loads it, so the script sets it
  before importing torch; exporting it in the shell works the same): on an AVX-512/VNNI CPU it runs fbgemm's AVX2
  kernels, the path of an AVX2-only machine. CTranslate2's int8 GEMM is MKL's: ``MKL_ENABLE_INSTRUCTIONS=AVX2`` in
  the environment restricts it (and torch's MKL) the same way.
- **int8 against fp32 accuracy.** ``--accuracy N`` (default 50, 20 with ``--quick``; 0 skips it): greedy held-out
  evaluation of the first N test questions of the default run (``configs/default.yaml``: its env, prompt, tool
  limit and budgets) with ``FastPolicy(weight_format="int8")`` and ``"fp32"`` of the embedded model, through
  `rapo_agents.evaluation.evaluate`. Each accuracy has a 95% bootstrap CI, the paired difference int8 - fp32 its
  paired CI, and the fraction of questions whose final answers (and whole responses) are identical is given, which
  is what still compares the two when the base model scores near 0 (with the share of a response the two have in
  common before they first differ). ``--accuracy-model PATH`` compares another
  model folder instead (a checkpoint after the warm-up answers where the base model rarely does).

Also measured: the weight sync of one training step (a `FastPolicy.repack`), folded into
``rapo_tokens_per_s_with_sync`` for a step of ``--step-tokens`` tokens, and the log-prob difference of the fast
path against the trained module on the fast path's own sequences.

Threads: every figure uses ``--threads`` threads (default 1) with ``OMP_WAIT_POLICY=PASSIVE``.

Run: ``nice -n 10 python benchmarks/generation.py`` (``--quick``: 2 rounds of 24 tokens, 20 questions, a few
minutes; ``--fbgemm-isa AVX2`` for the AVX2 kernels). Writes ``benchmarks/results/generation.json``
(``generation_fbgemm_avx2.json`` with ``--fbgemm-isa AVX2``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads starve the other processes
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _machine import cpu_facts, cpu_line, parse_cpuinfo  # noqa: E402,F401  (parse_cpuinfo: tested here)
from _report import CONFIGS, RESULTS_DIR, report  # noqa: E402
from _rounds import interleaved_rounds, show, spread  # noqa: E402

# torch and rapo_agents load in main(), after --fbgemm-isa has set the variable fbgemm reads when torch loads.

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? Use the python tool to check your "
            "arithmetic, reason step by step, and give the final answer in \\boxed{}.")

ENGINE_LABELS = {"hf": "HF", "fast": "Fast", "ct2": "CT2"}
"""Column names of the engines: `HFPolicy`, `FastPolicy`, the CTranslate2 anchor."""

DEFAULT_CONFIG = CONFIGS / "default.yaml"
"""The run whose held-out questions and settings the accuracy comparison uses."""


def last_level_cache_bytes() -> int | None:
    """Size of cpu0's largest cache (sysfs), None when the kernel does not say."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


def read_bandwidth(data: Any, repeats: int) -> float:
    """One thread's read bandwidth (bytes/s): the best of ``repeats`` sums of the float32 tensor ``data``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - started)
        return data.numel() * 4 / best
    finally:
        torch.set_num_threads(before)


def storage_bytes(value: Any) -> dict[str, int]:
    """Bytes held by ``value`` per dtype: tensors, fbgemm packed weights (their int8 payload), and the tensors
    inside lists, dataclasses and plain objects (a `_Linear`, a `_Layer`).

    fbgemm's per-channel scales and column offsets (a few KB a model) are not counted: unpacking gives them in
    other dtypes than the kernel reads.
    """
    import torch

    counts: dict[str, int] = {}

    def add(other: dict[str, int]) -> None:
        for dtype, size in other.items():
            counts[dtype] = counts.get(dtype, 0) + size

    if isinstance(value, torch.Tensor):
        add({str(value.dtype).removeprefix("torch."): value.nelement() * value.element_size()})
    elif isinstance(value, torch.ScriptObject):
        if "LinearPackedParams" not in str(value._type()):
            raise TypeError(f"cannot size a {value._type()} (only fbgemm linear packed weights are known)")
        weight, bias = torch.ops.quantized.linear_unpack(value)
        add(storage_bytes(weight))
        if bias is not None:
            add(storage_bytes(bias))
    elif isinstance(value, (list, tuple)):
        for item in value:
            add(storage_bytes(item))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            add(storage_bytes(getattr(value, field.name)))
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for item in vars(value).values():
            add(storage_bytes(item))
    return counts


def decode_bytes_per_token(decoder: Any) -> dict[str, Any]:
    """Bytes a batch-1 decode step of ``decoder`` (a `LlamaDecoder`) reads: its layers, final norm and lm_head as
    stored, plus the one embedding row it looks up (not the whole table); ``by_dtype`` and ``total``.

    The KV cache is left out: it grows with the context (``kv_bytes_per_context_token`` gives its rate).
    """
    by_dtype = storage_bytes([decoder.layers, decoder.final_norm, decoder.lm_head])
    row = decoder.embed[0]
    embed_dtype = str(row.dtype).removeprefix("torch.")
    by_dtype[embed_dtype] = by_dtype.get(embed_dtype, 0) + row.nelement() * row.element_size()
    return {"by_dtype": by_dtype, "total": sum(by_dtype.values()),
            "kv_bytes_per_context_token": 2 * len(decoder.layers) * decoder.kv_heads * decoder.head_dim
            * decoder.dtype.itemsize}


# ---- the engines ------------------------------------------------------------------------------------------

def prompt_ids(tokenizer, length: int) -> list[int]:
    """A chat turn of exactly ``length`` tokens (the question repeated, then cut from the left)."""
    text = " ".join([QUESTION] * (1 + length // 40))
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                         add_generation_prompt=True), add_special_tokens=False)
    return ids[-length:]


def timed_generate(policy, context: list[int], batch: int, new_tokens: int, seed: int):
    """Tokens per second of one `Policy.generate` call (prefill included) and its generations."""
    from rapo_agents.policies import SamplingParams

    params = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop=(), seed=seed * 100 + row)
              for row in range(batch)]
    started = time.perf_counter()
    generations = policy.generate([context] * batch, params)
    seconds = time.perf_counter() - started
    return sum(g.num_tokens for g in generations) / seconds, generations


class CT2Anchor:
    """CTranslate2 int8 generation of the same weights: converted once into ``cache_dir``, one generator per
    thread count (``intra_threads`` is fixed when a generator is made)."""

    def __init__(self, model_path: str, tokenizer: Any, cache_dir: Path):
        import ctranslate2

        self.ctranslate2, self.tokenizer = ctranslate2, tokenizer
        self.version = ctranslate2.__version__
        self.path = cache_dir / f"{Path(model_path).name}-int8-ct2-{self.version}"
        if not (self.path / "model.bin").is_file():
            staging = self.path.with_name(self.path.name + ".partial")
            shutil.rmtree(staging, ignore_errors=True)
            ctranslate2.converters.TransformersConverter(model_path).convert(str(staging), quantization="int8")
            staging.rename(self.path)  # a half-written conversion is never taken for a finished one
        self._generators: dict[int, Any] = {}

    def generator(self, threads: int) -> Any:
        if threads not in self._generators:
            self._generators[threads] = self.ctranslate2.Generator(
                str(self.path), device="cpu", compute_type="int8", intra_threads=threads)
        return self._generators[threads]

    def tokens_per_s(self, context: list[int], batch: int, new_tokens: int, seed: int, threads: int) -> float:
        """Tokens per second of one ``generate_batch`` of ``batch`` copies of ``context`` (prefill included)."""
        self.ctranslate2.set_random_seed(seed)
        start = self.tokenizer.convert_ids_to_tokens(context)
        generator = self.generator(threads)
        started = time.perf_counter()
        # No end token and min_length = max_length: exactly new_tokens per row, as the other engines make.
        results = generator.generate_batch([start] * batch, max_length=new_tokens, min_length=new_tokens,
                                           end_token=[], sampling_topk=0, sampling_temperature=1.0,
                                           include_prompt_in_result=False)
        seconds = time.perf_counter() - started
        made = [len(result.sequences_ids[0]) for result in results]
        if made != [new_tokens] * batch:
            raise RuntimeError(f"CTranslate2 made {made} tokens per row, not {new_tokens}")
        return sum(made) / seconds


def ct2_or_reason(model_path: str, tokenizer: Any) -> tuple[CT2Anchor | None, str | None]:
    """The anchor, or None and why it is skipped (ctranslate2 is an optional extra)."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return None, ("CTranslate2 anchor skipped: ctranslate2 is not installed (pip install -e '.[ct2]', or "
                      "pip install 'ctranslate2>=4')")
    return CT2Anchor(model_path, tokenizer, RESULTS_DIR / "ct2"), None


def logprob_diffs(model, context: list[int], generations):
    """|rollout - trained module| log-prob of every generated token, teacher-forced."""
    import torch

    diffs = []
    for generation in generations:
        ids = torch.tensor([context + generation.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits.float()[0], dim=-1)
        chosen = logprobs[len(context) - 1 : -1].gather(-1, torch.tensor(generation.token_ids)[:, None])
        diffs.append((torch.tensor(generation.logprobs) - chosen.squeeze(-1)).abs())
    return torch.cat(diffs)


# ---- accuracy ---------------------------------------------------------------------------------------------

def digest(text: str) -> str:
    """A short digest of a response: equal digests in two runs mean the same text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def shared_prefix(first: str, second: str) -> float:
    """Share of the longer text that the two have in common before they first differ (1.0: identical).

    Example:
        >>> shared_prefix("The answer is 4", "The answer is 5"), shared_prefix("", "")
        (0.9333333333333333, 1.0)
    """
    if not first and not second:
        return 1.0
    return len(os.path.commonprefix([first, second])) / max(len(first), len(second))


def heldout_accuracy(model: Any, tokenizer: Any, questions: int, label: str) -> dict[str, Any]:
    """Greedy held-out accuracy of int8 and fp32 `FastPolicy` decoding of ``model`` (named ``label``) on the
    default run's first ``questions`` test questions, with CIs, their paired difference and how often the two
    answer alike."""
    from rapo_agents.config import load_config
    from rapo_agents.evaluation import EvalConfig, evaluate
    from rapo_agents.rollout import RolloutConfig
    from rapo_agents.heldout import bootstrap_ci, heldout_env_kwargs, paired_difference
    from rapo_agents.policies.fast import FastPolicy
    from rapo_agents.trainer import training_env_kwargs

    config = load_config(DEFAULT_CONFIG)
    heldout = dataclasses.replace(config.evaluation, heldout_tasks=questions)
    rows: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for weight_format in ("int8", "fp32"):
            evaluation = EvalConfig(
                env=config.data.env_id, env_kwargs=heldout_env_kwargs(training_env_kwargs(config), heldout),
                limit=questions, rollout=RolloutConfig(
                    temperature=0.0, top_p=1.0, top_k=0, max_prompt_tokens=config.rollout.max_prompt_tokens,
                    max_response_tokens=heldout.max_eval_tokens or config.rollout.max_response_tokens,
                    max_turn_tokens=config.rollout.max_turn_tokens),
                output=f"{folder}/{weight_format}.jsonl", resume=False, chunk_size=questions, seed=config.seed,
                show_progress=False, model=f"{label} ({weight_format})")
            started = time.perf_counter()
            found = evaluate(FastPolicy(model, tokenizer, weight_format=weight_format), evaluation).rows
            seconds[weight_format] = time.perf_counter() - started
            failed = [row for row in found if row.get("failed")]
            if failed:
                raise RuntimeError(f"{len(failed)} {weight_format} evaluation rollouts failed: "
                                   f"{failed[0].get('error')}")
            rows[weight_format] = found
    keys = [row["task_index"] for row in rows["fp32"]]
    if keys != [row["task_index"] for row in rows["int8"]]:
        raise RuntimeError("the int8 and fp32 evaluations covered other questions")
    pairs = list(zip(rows["int8"], rows["fp32"], strict=True))
    result: dict[str, Any] = {"model": label, "questions": len(keys), "env": config.data.env_id,
                              "split": heldout.split,
                              "config": str(DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[1])),
                              "eval_seconds": seconds}
    for weight_format, found in rows.items():
        correct = [float(row["accuracy"]) for row in found]
        low, high = bootstrap_ci(correct, heldout.confidence, heldout.bootstrap_resamples, config.seed)
        result[weight_format] = {"accuracy": statistics.fmean(correct), "ci_low": low, "ci_high": high,
                                 "mean_tokens": statistics.fmean(row["response_tokens"] for row in found)}
    difference = paired_difference([float(row["accuracy"]) for row in rows["fp32"]],
                                   [float(row["accuracy"]) for row in rows["int8"]],
                                   heldout.confidence, heldout.bootstrap_resamples, config.seed)
    result["int8_minus_fp32"] = dataclasses.asdict(difference)
    for weight_format, found in rows.items():  # a base model that never answers agrees with anything on None
        result[weight_format]["answered"] = statistics.fmean(float(bool(row["prediction"])) for row in found)
    result["same_answer"] = statistics.fmean(float(a["prediction"] == b["prediction"]) for a, b in pairs)
    result["same_response"] = statistics.fmean(float(a["response"] == b["response"]) for a, b in pairs)
    # Greedy decoding diverges for good at the first flipped token: how far the two go together before it.
    result["shared_response_prefix"] = statistics.fmean(shared_prefix(a["response"], b["response"]) for a, b in pairs)
    result["within_ci"] = difference.low <= 0.0 <= difference.high
    # What two runs (two CPUs, two ISAs) compare question by question: the answers and a digest of each response.
    result["per_question"] = [
        {"task_index": a["task_index"], **{f"{name}_{field}": row[key] for name, row in (("int8", a), ("fp32", b))
                                           for field, key in (("correct", "accuracy"), ("answer", "prediction"))},
         "int8_response_sha256": digest(a["response"]), "fp32_response_sha256": digest(b["response"])}
        for a, b in pairs]
    return result


# ---- output -----------------------------------------------------------------------------------------------

def print_table(title: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """A table printed like `_report.report`'s (which also writes the JSON, once, with the main table)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns))
    Console(width=200).print(table)


def percent_of_limit(engine: dict[str, Any]) -> str:
    """``all-in (decode-only)`` percent of the limit of one engine's batch-1 figures (``-`` where undefined).

    Example:
        >>> percent_of_limit({"fraction_of_limit": 0.214, "decode_fraction_of_limit": None})
        '21 (-)'
    """
    decode = engine["decode_fraction_of_limit"]
    return f"{100 * engine['fraction_of_limit']:.0f} ({'-' if decode is None else f'{100 * decode:.0f}'})"


def gigabytes(rates: dict[str, float]) -> str:
    """A `spread` of bytes/s as ``best GB/s (median, min)``: the best is the machine's, the rest its neighbours'."""
    return f"{rates['max'] / 1e9:.2f} GB/s (median {rates['median'] / 1e9:.2f}, min {rates['min'] / 1e9:.2f})"


def uptime_load() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per setting")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens generated per row")
    parser.add_argument("--prompt-tokens", type=int, default=160, help="prompt length in tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts to measure")
    parser.add_argument("--step-tokens", type=int, default=2048,
                        help="generated tokens per training step (8 rollouts x 256) over which one sync is paid")
    parser.add_argument("--accuracy", type=int, default=None, metavar="N",
                        help="held-out questions of the int8 vs fp32 comparison (default 50, 20 with --quick; "
                             "0 skips it)")
    parser.add_argument("--accuracy-model", default=None, metavar="PATH",
                        help="model folder of the accuracy comparison (default: the embedded model; e.g. a "
                             "checkpoint after the warm-up, which answers where the base model rarely does)")
    parser.add_argument("--fbgemm-isa", default=None, metavar="ISA",
                        help="set FBGEMM_ENABLE_INSTRUCTIONS (e.g. AVX2: fbgemm's AVX2 kernels on an AVX-512 CPU) "
                             "before torch loads")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 24 tokens, 20 accuracy questions")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.new_tokens = 2, 24
    if args.accuracy is None:
        args.accuracy = 20 if args.quick else 50
    if min(args.rounds, args.new_tokens, args.prompt_tokens, *args.batches, *args.threads) < 1 or args.accuracy < 0:
        parser.error("--rounds, --new-tokens, --prompt-tokens, --batches and --threads must be >= 1, "
                     "--accuracy >= 0")
    if args.fbgemm_isa is not None:
        if "torch" in sys.modules:
            parser.error("--fbgemm-isa must be applied before torch loads, and torch is already imported")
        os.environ["FBGEMM_ENABLE_INSTRUCTIONS"] = args.fbgemm_isa

    import torch

    from rapo_agents.policies.fast import FastPolicy
    from rapo_agents.policies.hf import HFPolicy, default_policy_path

    cpu = cpu_facts()
    machine = cpu_line(cpu)
    print(machine)
    print(f"load average at start: {uptime_load()}")
    model_path = default_policy_path()
    reference = HFPolicy.from_pretrained(model_path, device="cpu")
    # --threads decides, for every engine; the prefix cache is off so that each call prefills its whole prompt,
    # as the other engines do (the same prompt every round would otherwise be prefilled once).
    fast = FastPolicy(reference.model, reference.tokenizer, threads=None, prefix_cache_bytes=0)
    anchor, skipped = ct2_or_reason(model_path, reference.tokenizer)
    if skipped:
        print(skipped)
    context = prompt_ids(reference.tokenizer, args.prompt_tokens)

    # The limit: bytes streamed per batch-1 token from the decoder's own storage, over one core's bandwidth,
    # measured in every round beside the engines (other processes' memory traffic moves it as much as load does).
    streamed = decode_bytes_per_token(fast.decoder)
    cache = last_level_cache_bytes()
    # Written once, so that every page is mapped before any timing.
    buffers = {"dram": torch.ones(max(4 * (cache or 0), 1 << 30) // 4),
               "working_set": torch.ones(streamed["total"] // 4)}
    dram_bytes = buffers["dram"].numel() * 4
    bandwidths: dict[str, list[float]] = {name: [] for name in buffers}

    def bandwidth() -> float:
        for name, data in buffers.items():
            bandwidths[name].append(read_bandwidth(data, repeats=3))
        return bandwidths["dram"][-1]

    # Each engine: (batch, new tokens, seed, threads) -> tokens/s; torch's engines take the threads set per setting.
    engines = {"hf": lambda batch, tokens, seed, _threads: timed_generate(reference, context, batch, tokens, seed)[0],
               "fast": lambda batch, tokens, seed, _threads: timed_generate(fast, context, batch, tokens, seed)[0]}
    if anchor is not None:
        engines["ct2"] = lambda batch, tokens, seed, threads: anchor.tokens_per_s(context, batch, tokens, seed, threads)
    ttft_column = "TTFT ms (" + "/".join(ENGINE_LABELS[name] for name in engines) + ")"
    measured: list[tuple[int, int, dict[str, Any], list[float]]] = []  # threads, batch, figures, loads
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
            for engine in engines.values():
                engine(batch, 4, 0, threads)  # warm-up: allocator, kernels, CTranslate2's first-call setup

            def rate(name: str, batch: int = batch, threads: int = threads) -> float:
                if name == "fast" and len(diffs) < len(args.batches):
                    tokens_per_s, generations = timed_generate(fast, context, batch, args.new_tokens, seed=1)
                    diffs.append(logprob_diffs(reference.model, context, generations))
                    return tokens_per_s
                return engines[name](batch, args.new_tokens, 1, threads)

            def first_token(name: str, batch: int = batch, threads: int = threads) -> float:
                return batch / engines[name](batch, 1, 1, threads)  # seconds of a 1-token generation of the batch

            systems = {name: (lambda name=name: rate(name)) for name in engines}
            systems.update({f"ttft {name}": (lambda name=name: first_token(name)) for name in engines})
            systems["sync"] = sync
            systems["bandwidth"] = bandwidth
            results, loads = interleaved_rounds(systems, args.rounds)
            entry: dict[str, Any] = {"load_average": spread(loads)}
            for name in engines:
                rates, ttft = spread(results[name]), spread(results[f"ttft {name}"])
                total_s = batch * args.new_tokens / rates["median"]
                # The rest of the call after its first token: the decode steps alone. The two come from separate
                # calls, so with few new tokens noise can leave nothing after the first: then there is no figure.
                after_first = total_s - ttft["median"]
                decode = None
                if args.new_tokens > 1 and after_first > 0:
                    decode = batch * (args.new_tokens - 1) / after_first
                entry[name] = {"tokens_per_s": rates, "ttft_s": ttft, "decode_tokens_per_s": decode}
            fast_rate = entry["fast"]["tokens_per_s"]["median"]
            entry["rapo_tokens_per_s_with_sync"] = 1.0 / (1.0 / fast_rate
                                                          + statistics.median(results["sync"]) / args.step_tokens)
            entry["fast_over_hf"] = fast_rate / entry["hf"]["tokens_per_s"]["median"]
            if anchor is not None:
                entry["fast_over_ct2"] = fast_rate / entry["ct2"]["tokens_per_s"]["median"]
            measured.append((threads, batch, entry, loads))
    buffers.clear()  # 2 GB that the accuracy evaluation can use

    # The bound is the best the core read in any round: a contended round measures the neighbours, not the machine.
    limit = max(bandwidths["dram"]) / streamed["total"]
    limit_working_set = max(bandwidths["working_set"]) / streamed["total"]
    rows, summary = [], {}
    for threads, batch, entry, loads in measured:
        row = {"threads": threads, "batch": batch, "HF tok/s": show(entry["hf"]["tokens_per_s"]),
               "Fast tok/s": show(entry["fast"]["tokens_per_s"]), "Fast/HF": round(entry["fast_over_hf"], 2)}
        if anchor is not None:
            row.update({"CT2 int8 tok/s": show(entry["ct2"]["tokens_per_s"]),
                        "Fast/CT2": round(entry["fast_over_ct2"], 2)})
        if batch == 1:
            for name in engines:
                decode = entry[name]["decode_tokens_per_s"]
                entry[name].update(fraction_of_limit=entry[name]["tokens_per_s"]["median"] / limit,
                                   decode_fraction_of_limit=None if decode is None else decode / limit)
                row[f"{ENGINE_LABELS[name]} % limit"] = percent_of_limit(entry[name])
        row[ttft_column] = "/".join(f"{1000 * entry[name]['ttft_s']['median']:.0f}" for name in engines)
        row["Fast+sync tok/s"] = round(entry["rapo_tokens_per_s_with_sync"], 1)
        row["load avg"] = show(spread(loads))
        rows.append(row)
        summary[f"batch{batch}" + ("" if threads == 1 else f"_threads{threads}")] = entry
    bandwidth_figures = {"dram_bytes_per_s": spread(bandwidths["dram"]), "dram_buffer_bytes": dram_bytes,
                         "working_set_bytes_per_s": spread(bandwidths["working_set"]),
                         "last_level_cache_bytes": cache, "repeats_per_round": 3}

    accuracy = None
    if args.accuracy:
        judged = reference if args.accuracy_model is None else HFPolicy.from_pretrained(args.accuracy_model,
                                                                                        device="cpu")
        accuracy = heldout_accuracy(judged.model, judged.tokenizer, args.accuracy,
                                    label=args.accuracy_model or "embedded")
    all_diffs = torch.cat(diffs)
    extra = {
        "cpu": cpu,
        "settings": {"rounds": args.rounds, "new_tokens": args.new_tokens, "prompt_tokens": len(context),
                     "sampling": "temperature 1, full vocabulary, seeded rows, no stop strings or end token",
                     "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                     "step_tokens": args.step_tokens, "rapo_engine": fast.name, "model": model_path,
                     "fast_prefix_cache": "off (every call prefills its prompt)",
                     "ct2": None if anchor is None else {"version": anchor.version, "model": str(anchor.path),
                                                         "compute_type": "int8"},
                     "ct2_skipped": skipped},
        "bandwidth": bandwidth_figures,
        "bytes_per_token": streamed,
        "limit_tokens_per_s": limit,
        "limit_tokens_per_s_working_set": limit_working_set,
        "tokens_per_s": {key: {name: entry[name]["tokens_per_s"]["median"] for name in engines}
                         for key, entry in summary.items()},
        "fraction_of_limit": {name: summary["batch1"][name]["fraction_of_limit"] for name in engines}
        if "batch1" in summary else None,
        "logprob_mean_abs_diff": float(all_diffs.mean()),
        "logprob_max_abs_diff": float(all_diffs.max()),
        "sync_seconds_per_step": spread(sync_seconds),
        "accuracy": accuracy,
        "load_average": spread([entry["load_average"]["median"] for entry in summary.values()]),
        "load_average_end": uptime_load(),
        "details": summary,
    }
    columns = ["threads", "batch", "HF tok/s", "Fast tok/s", "Fast/HF"]
    if anchor is not None:
        columns += ["CT2 int8 tok/s", "Fast/CT2"]
    if 1 in args.batches:
        columns += [f"{ENGINE_LABELS[name]} % limit" for name in engines]
    columns += [ttft_column, "Fast+sync tok/s", "load avg"]
    print(machine)
    engines_named = f"HFPolicy vs FastPolicy ({fast.decoder.weight_format})" + (
        "" if anchor is None else " vs CTranslate2 int8")
    # An ISA-capped run keeps its own file, so that it sits beside the default one instead of replacing it.
    name = "generation" if args.fbgemm_isa is None else f"generation_fbgemm_{args.fbgemm_isa.lower()}"
    report(name, f"CPU generation, SmolLM2-135M, {len(context)} prompt + {args.new_tokens} new tokens, "
           f"temperature 1: {engines_named} (medians, min-max; % limit: all-in (decode-only))", columns, rows, extra)
    if skipped:
        print(skipped)
    print(machine)
    print_table("Bandwidth-bound limit at batch 1 (one core)", ["measure", "value"], [
        {"measure": "read bandwidth, DRAM (buffer "
                    f"{dram_bytes / 2**20:.0f} MiB, LLC {(cache or 0) / 2**20:.0f} MiB)",
         "value": gigabytes(bandwidth_figures["dram_bytes_per_s"])},
        {"measure": f"read bandwidth, working-set size ({streamed['total'] / 1e6:.1f} MB)",
         "value": gigabytes(bandwidth_figures["working_set_bytes_per_s"])},
        {"measure": "bytes per token (" + ", ".join(f"{d} {b / 1e6:.1f} MB" for d, b in
                                                    streamed["by_dtype"].items()) + ")",
         "value": f"{streamed['total'] / 1e6:.1f} MB"},
        {"measure": "limit (best DRAM bandwidth / bytes per token)", "value": f"{limit:.1f} tok/s"},
        {"measure": "limit at the best working-set bandwidth", "value": f"{limit_working_set:.1f} tok/s"},
    ])
    if accuracy is not None:
        print(machine)
        print_table(f"Held-out accuracy, greedy, {accuracy['questions']} questions of {accuracy['env']} "
                    f"({accuracy['config']}, {accuracy['split']} split), {accuracy['model']} model, int8 vs fp32 "
                    "decoding", ["decoding", "accuracy [95% CI]", "answered", "mean tokens", "eval s"],
                    [{"decoding": name, "accuracy [95% CI]": f"{accuracy[name]['accuracy']:.3f} "
                                                             f"[{accuracy[name]['ci_low']:.3f}, "
                                                             f"{accuracy[name]['ci_high']:.3f}]",
                      "answered": f"{accuracy[name]['answered']:.0%}",
                      "mean tokens": f"{accuracy[name]['mean_tokens']:.1f}",
                      "eval s": f"{accuracy['eval_seconds'][name]:.0f}"} for name in ("int8", "fp32")])
        difference = accuracy["int8_minus_fp32"]
        print(f"int8 - fp32 (paired): {difference['mean']:+.3f} [{difference['low']:+.3f}, {difference['high']:+.3f}]"
              f" ({'within' if accuracy['within_ci'] else 'outside'} the CI of no difference); same final answer "
              f"{accuracy['same_answer']:.0%}, same response {accuracy['same_response']:.0%} of the questions; "
              f"on average {accuracy['shared_response_prefix']:.0%} of a response is shared before they differ")
        if accuracy["fp32"]["accuracy"] < 0.1:
            print("The model scores near 0 on this task: the accuracies say little, the identical answers and "
                  "responses say how far int8 decoding moves from fp32's (--accuracy-model takes a checkpoint).")
    print(f"log-prob |diff| mean {extra['logprob_mean_abs_diff']:.4f} max {extra['logprob_max_abs_diff']:.3f}; "
          f"sync {extra['sync_seconds_per_step']['median']:.2f} s/step; load average at end: {uptime_load()}")


if __name__ == "__main__":
    main()
