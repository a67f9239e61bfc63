"""``rapo envs``: list the registered environments, their tools and datasets."""

from __future__ import annotations

import argparse

HELP = "List the registered rapo environments with their tools and datasets."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def describe_envs() -> list[dict[str, str]]:
    """One row per registered rapo env: id, entry point, tools, datasets (the env class is imported, not built)."""
    import gymnasium as gym

    import rapo_env

    rows = []
    for env_id in rapo_env.RAPO_ENV_IDS:
        spec = gym.spec(env_id)
        env_class = gym.envs.registration.load_env_creator(spec.entry_point)
        rows.append({
            "id": env_id,
            "entry_point": str(spec.entry_point),
            "tools": ", ".join(getattr(env_class, "TOOLS", ())),
            "datasets": getattr(env_class, "DATASETS", ""),
            "nondeterministic": str(spec.nondeterministic),
        })
    return rows


def run(args: argparse.Namespace) -> int:
    rows = describe_envs()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rapo environments")
    for column in ("id", "tools", "datasets"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["id"], row["tools"], row["datasets"])
    Console().print(table)
    return 0
