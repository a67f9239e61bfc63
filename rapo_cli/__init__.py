"""The ``rapo`` command. Each subcommand is a module with ``HELP``, ``add_arguments`` and ``run``,
imported only when it is used, so ``rapo --help`` stays fast and a missing optional
dependency only affects its own subcommand.

Example:
    >>> main(["envs"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "envs": ("rapo_cli.envs", "list the registered environments, their tools and datasets"),
    "rollout": ("rapo_cli.rollout", "play episodes and write trajectories as JSONL"),
    "eval": ("rapo_cli.eval", "evaluate a policy on an env: accuracy or EM/F1, tool calls, tokens (resumable)"),
    "buffer": ("rapo_cli.buffer", "build, index and serve a step-trace buffer (POST /retrieve)"),
    "train": ("rapo_cli.train", "train a policy with RAPO (no arguments: the embedded CPU default)"),
    "search": ("rapo_cli.search", "build a knowledge-search index and serve it at POST /wikiSearch"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; subcommand modules add their own arguments when chosen."""
    parser = argparse.ArgumentParser(
        prog="rapo",
        description="Train and evaluate tool-using LLM agents with RAPO (retrieval-augmented policy optimization).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        commands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rapo`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])  # prints help or the "invalid choice" error and exits
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_parser = argparse.ArgumentParser(prog=f"rapo {name}", description=module.HELP)
    module.add_arguments(sub_parser)
    return int(module.run(sub_parser.parse_args(rest)) or 0)
