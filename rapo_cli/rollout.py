"""``rapo rollout``: play episodes of an env with any policy and write the trajectories as JSONL.

This is the off-policy source of the step-trace buffer (``rapo buffer build`` reads the file).
``--policy expert`` replays procedural math solution programs through the real tool (text
level); the model backends (``hf``, ``vllm``, ``openai``, ``scripted``) run through the rollout
engine, token in, token out, so their trajectories also carry token ids, masks and log-probs.

Example:
    rapo rollout --episodes 8 --rollouts-per-question 4 --output runs/expert.jsonl
    rapo rollout --policy openai --base-url http://127.0.0.1:8000/v1 --tokenizer path --temperature 0.6
"""

from __future__ import annotations

import argparse

from rapo_cli import checks

HELP = "Play episodes with a policy and write trajectories as JSONL (the off-policy source of the buffer)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rapo_agents.policies.factory import add_policy_arguments

    parser.add_argument("--env", default="RAPO-Math-v0", help="registered env id")
    parser.add_argument("--env-kwargs", default="{}", help="JSON dict of gym.make keyword arguments")
    add_policy_arguments(parser, default="expert", extra_kinds=("expert",))
    parser.add_argument("--agent", dest="policy", choices=["expert"], help=argparse.SUPPRESS)  # the first CLI's name
    parser.add_argument("--episodes", type=int, default=8, help="number of episodes (questions)")
    parser.add_argument("--rollouts-per-question", type=int, default=1, help="rollouts of each question (G)")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (model policies)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (model policies)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="response token budget (model policies)")
    parser.add_argument("--output", default="runs/rollouts.jsonl", help="JSONL file to write")
    parser.add_argument("--seed", type=int, default=0)


def _expert_rollouts(args: argparse.Namespace, env_kwargs: dict):
    import gymnasium as gym
    from tqdm import tqdm

    import rapo_env  # noqa: F401  (registers the envs)
    from rapo_agents.scripted import ExpertAgent, run_text_episode

    env = gym.make(args.env, **env_kwargs)
    agent = ExpertAgent(env.unwrapped.tasks, max_tool_calls=env.unwrapped.max_tool_calls)
    trajectories = []
    try:
        for question in tqdm(range(args.episodes), desc="episodes", unit="ep"):
            for rollout in range(args.rollouts_per_question):
                trajectories.append(run_text_episode(env, agent, task_index=question % len(env.unwrapped.tasks),
                                                     rollout_index=rollout, seed=args.seed + question))
    finally:
        env.close()
    return trajectories, agent.name


def _engine_rollouts(args: argparse.Namespace, env_kwargs: dict):
    from rapo_agents.policies.factory import policy_from_args
    from rapo_agents.rollout import RolloutConfig, RolloutEngine

    policy = policy_from_args(args)
    config = RolloutConfig(rollout_n=args.rollouts_per_question, temperature=args.temperature, top_p=args.top_p,
                           max_response_tokens=args.max_tokens, show_progress=True)
    with RolloutEngine(args.env, policy, config, env_kwargs=env_kwargs) as engine:
        questions = [q % len(engine.tasks) for q in range(args.episodes)]
        return engine.run(questions, seed=args.seed), getattr(policy, "name", args.policy)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rapo_env.trajectory import write_jsonl

    checks.env_id(args.env)
    env_kwargs = checks.env_kwargs(args.env_kwargs, env=args.env)
    if args.policy != "expert":
        checks.policy(args)
    for name in ("episodes", "rollouts_per_question", "max_tokens"):
        if getattr(args, name) < 1:
            raise checks.UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    checks.output_file(args.output, "--output")
    if args.policy == "expert":
        trajectories, source = _expert_rollouts(args, env_kwargs)
    else:
        trajectories, source = _engine_rollouts(args, env_kwargs)
    write_jsonl(args.output, trajectories)
    table = Table(title=f"{args.env}: {len(trajectories)} episodes by {source}")
    for column in ("task", "rollout", "tool calls", "end", "reward"):
        table.add_column(column)
    for trajectory in trajectories:
        table.add_row(trajectory.task_id, str(trajectory.rollout_index), str(trajectory.num_tool_calls),
                      trajectory.end_reason, f"{trajectory.reward:g}")
    console = Console()
    console.print(table)
    solved = sum(t.reward > 0 for t in trajectories)
    console.print(f"solved {solved}/{len(trajectories)}; trajectories written to {args.output}")
    return 0
