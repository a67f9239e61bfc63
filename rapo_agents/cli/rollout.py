"""``rapo rollout``: play episodes of an env and write the trajectories as JSONL."""

from __future__ import annotations

import argparse
import json

HELP = "Play episodes with an agent and write trajectories as JSONL (the off-policy source of the buffer)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="RAPO-Math-v0", help="registered env id")
    parser.add_argument("--env-kwargs", default="{}", help="JSON dict of gym.make keyword arguments")
    parser.add_argument("--agent", default="expert", choices=["expert"],
                        help="expert: replays procedural math solution programs through the real tool")
    parser.add_argument("--episodes", type=int, default=8, help="number of episodes (questions)")
    parser.add_argument("--rollouts-per-question", type=int, default=1, help="rollouts of each question (G)")
    parser.add_argument("--output", default="runs/rollouts.jsonl", help="JSONL file to write")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    import rapo_env  # noqa: F401  (registers the envs)
    from rapo_agents.scripted import ExpertAgent, run_text_episode
    from rapo_env.trajectory import write_jsonl

    env = gym.make(args.env, **json.loads(args.env_kwargs))
    agent = ExpertAgent(env.unwrapped.tasks, max_tool_calls=env.unwrapped.max_tool_calls)
    trajectories = []
    try:
        for question in tqdm(range(args.episodes), desc="episodes", unit="ep"):
            for rollout in range(args.rollouts_per_question):
                trajectories.append(run_text_episode(env, agent, task_index=question % len(env.unwrapped.tasks),
                                                     rollout_index=rollout, seed=args.seed + question))
    finally:
        env.close()
    write_jsonl(args.output, trajectories)
    table = Table(title=f"{args.env}: {len(trajectories)} episodes by {agent.name}")
    for column in ("task", "tool calls", "end", "reward"):
        table.add_column(column)
    for trajectory in trajectories:
        table.add_row(trajectory.task_id, str(trajectory.num_tool_calls), trajectory.end_reason,
                      f"{trajectory.reward:g}")
    console = Console()
    console.print(table)
    solved = sum(t.reward > 0 for t in trajectories)
    console.print(f"solved {solved}/{len(trajectories)}; trajectories written to {args.output}")
    return 0
