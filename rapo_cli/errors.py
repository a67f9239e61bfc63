"""How the ``rapo`` command reports failures: a user's mistake is one line and exit code 2, never a traceback.

- `UsageError` (raised by `rapo_cli.checks`) names the setting and the fix;
- rapo's own error types that only bad input causes (a missing task file, corpus or index, a bad config, a
  missing embedded-model package) and missing files are reported the same way, whichever layer raised them;
- a full disk is said to be one, with what to free (a checkpoint that could not be written leaves the last
  complete one in place);
- anything else is a bug in rapo: one line that says so, exit code 1, and the traceback with ``--debug``
  or ``RAPO_DEBUG=1``.

Example:
    >>> describe(UsageError("--env 'X' is not a registered env"), "eval")
    (2, "rapo eval: error: --env 'X' is not a registered env")
"""

from __future__ import annotations

import errno
import os

DEBUG_ENV_VAR = "RAPO_DEBUG"
"""Set to 1 to get the traceback of every failure (as ``--debug`` does)."""


class UsageError(Exception):
    """A mistake in the command line or the config: the message names the setting and the fix."""


# Matched by qualified name along the exception's MRO, so that reporting an error never imports the module
# that defines its type (they are imported only when the subcommand that raises them runs).
USER_ERROR_TYPES = frozenset({
    "rapo_cli.errors.UsageError",
    "rapo_agents.settings.ConfigError",
    "rapo_agents.checkpoint.CheckpointError",
    "rapo_agents.policies.hf.ModelFileError",
    "rapo_agents.rollout.episode.PromptTooLongError",
    "rapo_agents.run_control.RunFolderBusyError",
    "rapo_env.tasks.files.TaskFileError",
    "rapo_env.envs.qa.QADatasetError",
    "rapo_env.tasks.knowledge_base.KnowledgeBaseError",
    "rapo_tools.models.EmbeddedModelMissingError",
    "rapo_tools.search.corpus.CorpusFormatError",
    "rapo_tools.search.faiss_index.IndexFileError",
    "rapo_tools.serving.ServerStartError",
    "rapo_tools.web.providers.base.MissingApiKeyError",
    "gymnasium.error.Error",
    "builtins.FileNotFoundError",
    "builtins.IsADirectoryError",
    "builtins.NotADirectoryError",
    "builtins.PermissionError",
    "builtins.ModuleNotFoundError",
})
"""Exception types whose message is the whole story for the user (exit code 2)."""

EXIT_USAGE = 2
EXIT_BUG = 1


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--debug`` (anywhere on the line) or ``RAPO_DEBUG=1`` asks for tracebacks, and argv without it."""
    rest = [arg for arg in argv if arg != "--debug"]
    return len(rest) != len(argv) or os.environ.get(DEBUG_ENV_VAR, "") not in ("", "0"), rest


def is_user_error(error: BaseException) -> bool:
    """True for the exception types of `USER_ERROR_TYPES` and their subclasses."""
    return any(f"{cls.__module__}.{cls.__qualname__}" in USER_ERROR_TYPES for cls in type(error).__mro__)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, ModuleNotFoundError) and error.name:
        return f"this needs the package that provides {error.name!r}: run `make setup` or pip install it ({text})"
    return text


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the disk is full: the OS error itself, or a library's error that wraps its text
    (safetensors raises its own ``SafetensorError`` with "No space left on device" in the message)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return os.strerror(errno.ENOSPC) in str(error)


def describe(error: BaseException, command: str) -> tuple[int, str]:
    """The exit code and the one line that report ``error`` raised by ``rapo COMMAND``."""
    if is_disk_full(error):
        return EXIT_USAGE, (f"rapo {command}: error: the disk is full ({_one_line(error)}): free space (old run "
                            "folders under runs/; `make clean` empties ~/.cache/rapo) or set logging.output_dir to "
                            "another disk, then rerun; rapo train resumes from the last complete checkpoint")
    if is_user_error(error):
        return EXIT_USAGE, f"rapo {command}: error: {_one_line(error)}"
    return EXIT_BUG, (f"rapo {command}: internal error (a bug in rapo, please report it): "
                      f"{type(error).__name__}: {_one_line(error)}; rerun with --debug or RAPO_DEBUG=1 "
                      "for the traceback")
