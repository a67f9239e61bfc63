"""Update throughput of rapo's PPO-style step against TRL's GRPOTrainer, same model, batch and lengths, one run.

Both sides take the same batch of ``--sequences`` rollouts (``--prompt-tokens`` prompt tokens, responses of
``--response-tokens`` at most, varied lengths, right-padded; with ``--tool-tokens``, a tool result of that many
tokens inside each response, out of the loss as in a multi-turn episode) and run one optimiser step over it with
the same micro-batch size and gradient accumulation, AdamW and grad-norm clipping:

- rapo: `rapo_agents.update.ppo_update` (token-mean loss over the mini-batch, RAPO's shaped dual-clip loss);
- TRL: ``GRPOTrainer.compute_loss`` (``loss_type="dapo"``, the same token-mean) + backward, clip and step,
  which is what ``GRPOTrainer.training_step`` runs after generation.

The batch size and micro-batch default to `rapo train`'s (``configs/default.yaml``: 4 questions x 4 rollouts,
micro-batches of 8). The two sides are interleaved over ``--rounds`` rounds (`_rounds.interleaved_rounds`), each
round on fresh copies of the model, one untimed update first. Reported: update tokens/s (prompt + response tokens
through forward and backward) and seconds per update as medians with min-max, peak memory growth during the
update (RSS on CPU, allocated bytes on CUDA), rapo/TRL ratios, the load average after each round and the CPU model.

    python benchmarks/train_step.py            # SmolLM2-135M-Instruct (the embedded model)
    python benchmarks/train_step.py --quick    # a tiny random Llama, seconds
    python benchmarks/train_step.py --tool-tokens 128   # multi-turn: rapo projects only the loss tokens' logits
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see rapo_agents/cli/train.py

import psutil
import torch

from _machine import cpu_facts
from _report import CONFIGS, report
from _rounds import interleaved_rounds, show, spread
from rapo_agents.batch import TrainBatch
from rapo_agents.config import load_config
from rapo_agents.rapo import RAPOConfig
from rapo_agents.update import UpdateSettings, ppo_update

SHIPPED = load_config(CONFIGS / "default.yaml")
"""What `rapo train` runs: its batch shape (questions x rollouts) and micro-batch are the defaults here."""


class PeakMemory:
    """Peak growth of process RSS (CPU, sampled every 5 ms) or of CUDA allocated bytes, in MiB."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mib = 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        process = psutil.Process()
        self._base = process.memory_info().rss
        self._stop = threading.Event()

        def sample():
            peak = self._base
            while not self._stop.wait(0.005):
                peak = max(peak, process.memory_info().rss)
            self.peak_mib = (peak - self._base) / 2**20

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated() - self._base) / 2**20
        else:
            self._stop.set()
            self._thread.join()


def load_model(quick: bool, device: torch.device):
    if quick:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
        return LlamaForCausalLM(config).to(device), "tiny random Llama (4k vocab, 2 layers)"
    from transformers import AutoModelForCausalLM

    from rapo_agents.policies.hf import default_policy_path

    model = AutoModelForCausalLM.from_pretrained(default_policy_path(), dtype=torch.float32)
    return model.to(device), "SmolLM2-135M-Instruct"


def make_batch(sequences: int, prompt_tokens: int, response_tokens: int, vocab: int, group: int,
               tool_tokens: int = 0) -> TrainBatch:
    """Random rollouts; ``tool_tokens`` of each response (after its first quarter) are a tool result, out of the
    loss."""
    generator = torch.Generator().manual_seed(0)
    width = prompt_tokens + response_tokens + tool_tokens
    lengths = torch.randint(response_tokens // 2, response_tokens + 1, (sequences,), generator=generator)
    input_ids = torch.randint(5, vocab, (sequences, width), generator=generator)
    attention = torch.zeros(sequences, width, dtype=torch.long)
    loss_mask = torch.zeros(sequences, width)
    for row, length in enumerate(lengths.tolist()):
        attention[row, : prompt_tokens + length + tool_tokens] = 1
        loss_mask[row, prompt_tokens : prompt_tokens + length + tool_tokens] = 1
        tool_start = prompt_tokens + length // 4
        loss_mask[row, tool_start : tool_start + tool_tokens] = 0
    rewards = torch.randint(0, 2, (sequences,), generator=generator).float()
    advantages = (rewards - rewards.view(-1, group).mean(-1).repeat_interleave(group)) / 0.5
    return TrainBatch(
        input_ids=input_ids * attention, attention_mask=attention, loss_mask=loss_mask,
        old_logprobs=torch.zeros(sequences, width), advantages=advantages, f_ret=torch.zeros(sequences),
        rewards=rewards, z_ret=torch.zeros(sequences), retrievals=torch.zeros(sequences, dtype=torch.long),
        entropy_pre=torch.full((sequences,), torch.nan), entropy_post=torch.full((sequences,), torch.nan),
        prompt_lengths=torch.full((sequences,), prompt_tokens),
    )


def with_sampler_logprobs(model, batch: TrainBatch, micro: int) -> TrainBatch:
    """Old log-probs as a sampler would give them (so that both losses see ratios of 1 on their first step)."""
    from rapo_agents.update import recompute_logprobs

    batch.old_logprobs = recompute_logprobs(model, batch, UpdateSettings(mini_batch_rows=len(batch.advantages),
                                                                          micro_batch_size=micro))
    return batch


def time_rapo(model, batch: TrainBatch, micro: int, device) -> tuple[float, float]:
    """Seconds and peak memory of one update, after an untimed one."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    settings = UpdateSettings(mini_batch_rows=len(batch.advantages), micro_batch_size=micro)
    results = []
    for _ in range(2):  # the first one warms up
        with PeakMemory(device) as memory:
            started = time.perf_counter()
            ppo_update(model, optimizer, batch, RAPOConfig(), settings)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        results.append((seconds, memory.peak_mib))
    return results[1]


def trl_inputs(batch: TrainBatch, rows: torch.Tensor, prompt_tokens: int, device) -> dict[str, torch.Tensor]:
    """The dict GRPOTrainer._compute_loss reads: prompt and completion ids/masks, advantages, old log-probs."""
    width = int(batch.attention_mask[rows].sum(-1).max())
    ids = batch.input_ids[rows, :width]
    attention = batch.attention_mask[rows, :width]
    return {
        "prompt_ids": ids[:, :prompt_tokens].to(device),
        "prompt_mask": attention[:, :prompt_tokens].to(device),
        "completion_ids": ids[:, prompt_tokens:].to(device),
        "completion_mask": batch.loss_mask[rows, prompt_tokens:width].long().to(device),  # tool results out
        "advantages": batch.advantages[rows].to(device),
        "old_per_token_logps": batch.old_logprobs[rows, prompt_tokens:width].to(device),
        "num_items_in_batch": batch.loss_mask.sum().to(device),
    }


def time_trl(model, tokenizer, batch: TrainBatch, micro: int, prompt_tokens: int, response_tokens: int,
             device) -> tuple[float, float]:
    """Seconds and peak memory of one GRPOTrainer update, after an untimed one."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sequences = len(batch.advantages)
    steps = sequences // micro
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro, gradient_accumulation_steps=steps,
        num_generations=micro, max_completion_length=response_tokens, loss_type="dapo", beta=0.0,
        epsilon=0.2, epsilon_high=0.28, learning_rate=1e-6, weight_decay=0.01, max_grad_norm=1.0,
        report_to=[], use_cpu=device.type == "cpu", bf16=False, logging_steps=1000, save_strategy="no",
        gradient_checkpointing=False,  # TRL turns it on by default; rapo does not on CPU, so compare like with like
    )
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * sequences}), processing_class=tokenizer)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = steps  # what Trainer's own loop sets before training_step
    optimizer = trainer.optimizer
    model = trainer.model
    model.train()
    results = []
    for _ in range(2):  # the first one warms up
        with PeakMemory(device) as memory:
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for start in range(0, sequences, micro):
                rows = torch.arange(start, start + micro)
                loss = trainer.compute_loss(model, trl_inputs(batch, rows, prompt_tokens, device))
                trainer.accelerator.backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        results.append((seconds, memory.peak_mib))
    return results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, short sequences")
    parser.add_argument("--sequences", type=int, default=SHIPPED.optim.train_batch_size * SHIPPED.rollout.rollout_n,
                        help="rollouts in the batch (one optimiser step; default: the shipped 4 questions x 4)")
    parser.add_argument("--micro-batch", type=int, default=SHIPPED.optim.micro_batch_size,
                        help="sequences per forward/backward (default: the shipped optim.micro_batch_size)")
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--response-tokens", type=int, default=None)
    parser.add_argument("--tool-tokens", type=int, default=0,
                        help="a tool result of this many tokens inside each response, out of the loss")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds, one timed update per side each "
                                                                 "(default 3, 2 with --quick)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    prompt_tokens = args.prompt_tokens or (64 if args.quick else 128)
    response_tokens = args.response_tokens or (128 if args.quick else 256)
    rounds = args.rounds or (2 if args.quick else 3)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from transformers import AutoTokenizer

    from rapo_agents.policies.hf import default_policy_path

    tokenizer = AutoTokenizer.from_pretrained(default_policy_path())
    base_model, model_name = load_model(args.quick, device)
    vocab = base_model.config.vocab_size
    batch = with_sampler_logprobs(base_model, make_batch(args.sequences, prompt_tokens, response_tokens, vocab,
                                                         group=SHIPPED.rollout.rollout_n, tool_tokens=args.tool_tokens),
                                  args.micro_batch)
    tokens = int(batch.attention_mask.sum())
    response = int(batch.loss_mask.sum())

    results, loads = interleaved_rounds({
        "rapo ppo_update": lambda: time_rapo(copy.deepcopy(base_model), batch, args.micro_batch, device),
        "TRL GRPOTrainer": lambda: time_trl(copy.deepcopy(base_model), tokenizer, batch, args.micro_batch,
                                            prompt_tokens, response_tokens + args.tool_tokens, device),
    }, rounds)

    rows = []
    for name, runs in results.items():
        seconds = spread([s for s, _ in runs])
        rows.append({"implementation": name, "update_s": show(seconds, 2), "tokens_per_s": tokens / seconds["median"],
                     "response_tokens_per_s": response / seconds["median"],
                     "peak_mem_mib": max(m for _, m in runs), "runs": len(runs), "seconds": seconds})
    ratio = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    memory_ratio = rows[0]["peak_mem_mib"] / max(rows[1]["peak_mem_mib"], 1e-9)
    for row in rows:
        row["speed_vs_trl"] = row["tokens_per_s"] / rows[1]["tokens_per_s"]
    report(
        "train_step",
        f"Update throughput, {model_name}, {args.sequences} seqs x ({prompt_tokens} prompt + <= {response_tokens} "
        f"response + {args.tool_tokens} tool) tokens, micro-batch {args.micro_batch}, {device}",
        ["implementation", "update_s", "tokens_per_s", "response_tokens_per_s", "peak_mem_mib", "speed_vs_trl", "runs"],
        rows,
        extra={"model": model_name, "device": str(device), "cpu_model": cpu_facts()["model"],
               "load_after_rounds": loads, "tokens": tokens, "response_tokens": response,
               "rapo_over_trl_throughput": ratio, "rapo_over_trl_peak_memory": memory_ratio,
               "tool_tokens": args.tool_tokens, "torch_threads": torch.get_num_threads(), "quick": args.quick},
    )
    print(f"rapo / TRL update throughput: {ratio:.2f}x; peak memory ratio {memory_ratio:.2f}; "
          f"load after each round {', '.join(f'{load:.2f}' for load in loads)}; {cpu_facts()['model']}")


if __name__ == "__main__":
    main()
