"""LoRA against full fine-tuning on the embedded model: checkpoint size, update time and sync time.

Each system is the trained module as `rapo_agents.model.trainable_model` builds it from a ``ModelConfig``:

- ``full, last 10`` (the default: full fine-tuning of the last ``model.trainable_layers=10`` layers);
- ``full, all 30`` (``model.trainable_layers=null``);
- ``LoRA r=16, last 10`` (``model.lora.r=16``: adapters on the default's layers);
- ``LoRA r=16, all 30`` (``model.lora.r=16 model.trainable_layers=null``).

Per system and round: one optimiser step of `rapo_agents.update.ppo_update` over the same batch of rollouts (as
`benchmarks/train_step.py` builds it; a first, untimed step warms up), a
weight sync (`FastPolicy.repack`: LoRA adds the merge), and the checkpoint the trainer would write after it
(`CheckpointManager.save` of the model and the optimiser's state): its size on disk. Systems are interleaved over
``--rounds`` (`_rounds.interleaved_rounds`); medians with min-max and the load average are reported, and
`benchmarks/results/lora.json` gets them. Peak memory is not measured here: in one process the allocator reuses
what the previous system freed, so an RSS delta reads near 0; compare whole runs (``/usr/bin/time -v rapo train``).

    python benchmarks/lora.py            # SmolLM2-135M-Instruct, 3 rounds
    python benchmarks/lora.py --quick    # a tiny random Llama, 2 rounds: seconds
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from _machine import cpu_facts, cpu_line
from _report import report
from _rounds import interleaved_rounds, show, spread
from rapo_agents.checkpoint import CheckpointManager
from rapo_agents.config import ModelConfig
from rapo_agents.lora import LoraSettings
from rapo_agents.model import trainable_model
from rapo_agents.policies import FastPolicy
from rapo_agents.rapo import RAPOConfig
from rapo_agents.update import UpdateSettings, ppo_update
from train_step import load_model, make_batch, with_sampler_logprobs


def folder_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def measure(base, tokenizer, config: ModelConfig, batch, micro: int, lr: float) -> dict[str, float]:
    """One system, one round: a warm-up step, a timed step, a sync, a checkpoint."""
    model, _ = trainable_model(config, torch.device("cpu"), copy.deepcopy(base), tokenizer)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    settings = UpdateSettings(mini_batch_rows=len(batch.advantages), micro_batch_size=micro)
    ppo_update(model, optimizer, batch, RAPOConfig(), settings)
    started = time.perf_counter()
    ppo_update(model, optimizer, batch, RAPOConfig(), settings)
    update_s = time.perf_counter() - started
    policy = FastPolicy(model, tokenizer)
    started = time.perf_counter()
    policy.repack()
    sync_s = time.perf_counter() - started
    folder = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    try:
        saved = CheckpointManager(folder).save(1, {"optimizer": optimizer.state_dict()}, model, None)
        checkpoint_mib = folder_mib(saved)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"update_s": update_s, "sync_s": sync_s, "checkpoint_mib": checkpoint_mib,
            "trainable_m": sum(parameter.numel() for parameter in trainable) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random Llama, short sequences, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 2)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--sequences", type=int, default=16, help="rollouts per update (the default run: 4 x 4)")
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    prompt_tokens, response_tokens = (64, 64) if args.quick else (160, 256)

    from transformers import AutoTokenizer

    from rapo_agents.policies.hf import default_policy_path

    tokenizer = AutoTokenizer.from_pretrained(default_policy_path())
    base, model_name = load_model(args.quick, torch.device("cpu"))
    if args.quick:  # the sync packs a calibration text in the embedded tokenizer's ids: its vocabulary, then
        from transformers import LlamaForCausalLM

        base = LlamaForCausalLM(dataclasses.replace(base.config, vocab_size=len(tokenizer)))
        model_name = f"tiny random Llama ({len(tokenizer)} vocab, {base.config.num_hidden_layers} layers)"
    layers = base.config.num_hidden_layers
    last = min(10, layers)
    batch = with_sampler_logprobs(base, make_batch(args.sequences, prompt_tokens, response_tokens,
                                                   base.config.vocab_size, group=4), args.micro_batch)
    lora = LoraSettings(r=args.rank, alpha=2.0 * args.rank)
    systems = {
        f"full, last {last}": ModelConfig(trainable_layers=last),
        f"full, all {layers}": ModelConfig(trainable_layers=None),
        f"LoRA r={args.rank}, last {last}": ModelConfig(trainable_layers=last, lora=lora),
        f"LoRA r={args.rank}, all {layers}": ModelConfig(trainable_layers=None, lora=lora),
    }
    print(f"{model_name}: {args.sequences} rollouts x ({prompt_tokens} prompt + <= {response_tokens} response) "
          f"tokens per update, micro-batch {args.micro_batch}, {rounds} rounds")
    results, loads = interleaved_rounds(
        {name: (lambda config=config: measure(base, tokenizer, config, batch, args.micro_batch, 2e-5))
         for name, config in systems.items()}, rounds)
    baseline = next(iter(systems))
    base_update = spread([r["update_s"] for r in results[baseline]])["median"]
    rows = []
    for name, runs in results.items():
        row = {"system": name, "trainable_M": runs[0]["trainable_m"]}
        for key in ("update_s", "sync_s", "checkpoint_mib"):
            row[key] = show(spread([run[key] for run in runs]), 2 if key.endswith("_s") else 1)
            row[f"{key}_spread"] = spread([run[key] for run in runs])
        row["update_vs_default"] = round(row["update_s_spread"]["median"] / base_update, 2)
        rows.append(row)
    cpu = cpu_facts()
    load = spread(loads)
    report("lora", f"LoRA vs full fine-tuning, {model_name}; medians (min-max) of {rounds} rounds, load "
           f"{show(load, 2)}; {cpu_line(cpu)}",
           ["system", "trainable_M", "update_s", "update_vs_default", "sync_s", "checkpoint_mib"], rows,
           {"model": model_name, "rounds": rounds, "load_average": load, "cpu": cpu, "quick": args.quick,
            "lora": dataclasses.asdict(lora), "sequences": args.sequences, "prompt_tokens": prompt_tokens,
            "response_tokens": response_tokens, "torch_threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
