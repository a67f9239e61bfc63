"""Train the embedded SmolLM2 on RAPO-Math-v0 with TRL's GRPOTrainer: rapo plays the episodes, TRL does GRPO.

TRL's ``rollout_func`` hook hands generation to `rapo_agents.integrations.trl_rollout.RapoRollout`, which plays
whole multi-turn episodes with the sandboxed python tool on the trainer's current weights and returns them token
in, token out, with an ``env_mask`` that keeps the tool results out of TRL's loss. The env's reward is TRL's.

Run (CPU, a few minutes): ``.venv/bin/python examples/trl_grpo.py --steps 2``
Needs ``trl`` (the ``dev`` extra installs it). For RAPO's retrieval splices, pass a `StepTraceRetrievalWrapper`
as ``wrappers`` to `RapoRollout`; RAPO's own advantage and shaping stay in ``rapo train``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Llama-family HF folder (default: the embedded SmolLM2)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO optimizer steps")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per task (TRL's G)")
    parser.add_argument("--tasks-per-step", type=int, default=2, help="tasks (groups) per step")
    parser.add_argument("--num-tasks", type=int, default=64, help="tasks of the env the dataset draws from")
    parser.add_argument("--max-response-tokens", type=int, default=256, help="response budget of an episode")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/trl-grpo", help="TRL's output folder (nothing is saved)")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> list[dict]:
    """Run TRL's GRPOTrainer on rapo episodes; returns TRL's log history (one entry per step, then a summary)."""
    from trl import GRPOConfig, GRPOTrainer

    from rapo_agents.integrations.trl_rollout import RapoRollout, rapo_reward, task_dataset
    from rapo_agents.policies.hf import HFPolicy
    from rapo_agents.rollout import RolloutConfig

    reference = HFPolicy.from_pretrained(args.model)  # None: the embedded SmolLM2-135M-Instruct
    model, tokenizer = reference.model, reference.tokenizer
    tokenizer.padding_side = "left"  # TRL's requirement
    batch = args.num_generations * args.tasks_per_step
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=args.learning_rate,
        per_device_train_batch_size=batch, num_generations=args.num_generations,
        max_completion_length=args.max_response_tokens, beta=0.0, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, bf16=False, dataloader_num_workers=0,
    )
    rollout = RapoRollout(
        "RAPO-Math-v0", env_kwargs={"num_tasks": args.num_tasks, "sandbox": "subprocess",
                                    "system_prompt": "short"},
        config=RolloutConfig(max_response_tokens=args.max_response_tokens, max_turn_tokens=128, max_tool_calls=2),
    )
    trainer = GRPOTrainer(model=model, reward_funcs=rapo_reward, args=config, processing_class=tokenizer,
                          train_dataset=task_dataset(args.num_tasks), rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.close()
    return trainer.state.log_history


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("This example needs TRL: pip install 'trl>=0.20' (or the rapo[dev] extra).", file=sys.stderr)
        return 2
    for entry in train(args):
        if "reward" in entry:
            print(f"step {entry['step']}: reward {entry['reward']:.3f}  loss {entry.get('loss', float('nan')):.4f}  "
                  f"policy tokens per completion {entry['completions/mean_length']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
