"""The ``rapo`` command. Each subcommand is a module with ``HELP``, ``add_arguments`` and ``run``,
imported only when it is used, so ``rapo --help`` stays fast and a missing optional
dependency only affects its own subcommand.

A user's mistake (a missing file, an unknown env, a bad setting) ends with one line naming the setting
and the fix, and exit code 2; ``--debug`` or ``RAPO_DEBUG=1`` shows tracebacks (`rapo_cli.errors`).

Example:
    >>> main(["envs"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rapo_cli.errors import debug_requested, describe

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "envs": ("rapo_cli.envs", "list the registered environments, their tools and datasets"),
    "rollout": ("rapo_cli.rollout", "play episodes and write trajectories as JSONL"),
    "eval": ("rapo_cli.eval", "evaluate a policy on an env: accuracy or EM/F1, tool calls, tokens (resumable)"),
    "buffer": ("rapo_cli.buffer", "build, index and serve a step-trace buffer (POST /retrieve)"),
    "train": ("rapo_cli.train", "train a policy with RAPO (no arguments: the embedded CPU default)"),
    "search": ("rapo_cli.search", "build a knowledge-search index and serve it at POST /wikiSearch"),
    "env": ("rapo_cli.env", "serve a registered env over the OpenEnv protocol (WebSocket sessions, one env each)"),
    "export": ("rapo_cli.export", "export a training checkpoint's policy as a Hugging Face model folder"),
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
    """Entry point of the ``rapo`` console script.

    A user's mistake prints one line and returns 2; a bug prints one line and returns 1; ``--debug``
    (anywhere on the line) or ``RAPO_DEBUG=1`` lets every exception through with its traceback.
    """
    debug, argv = debug_requested(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])  # prints help or the "invalid choice" error and exits
        return 2
    name, rest = argv[0], argv[1:]
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
        sub_parser = argparse.ArgumentParser(prog=f"rapo {name}", description=module.HELP,
                                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub_parser)
        return int(module.run(sub_parser.parse_args(rest)) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"rapo {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        code, line = describe(error, name)
        print(line, file=sys.stderr)
        return code
