"""Up-front checks of the ``rapo`` commands' inputs: every path and name is checked before any work starts.

Each check raises `UsageError` with one line that names the option and the fix, so a missing file is
reported in a second, not after a model load or a thousand scripted episodes.

Example:
    >>> env_kwargs('{"dataset": "procedural"}')
    {'dataset': 'procedural'}
    >>> existing_file("/nope/train.jsonl", "--input")
    Traceback (most recent call last):
    ...
    rapo_cli.errors.UsageError: --input: no file at /nope/train.jsonl
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rapo_cli.errors import UsageError

TASK_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
"""What a task file's name ends with; a ``dataset`` ending so must exist."""


def existing_file(path: str | os.PathLike[str], setting: str, fix: str = "") -> Path:
    """``path`` as a `Path`, or `UsageError` when no file is there."""
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        what = "a folder, not a file," if resolved.is_dir() else "no file"
        raise UsageError(f"{setting}: {what} at {path}" + (f"; {fix}" if fix else ""))
    return resolved


def output_file(path: str | os.PathLike[str], setting: str) -> Path:
    """``path`` as a `Path` that a file can be written to (its folder may not exist yet)."""
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        raise UsageError(f"{setting}: {path} is a folder; give a file name")
    for parent in resolved.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{setting}: {parent} is a file, so {path} cannot be created below it")
            if not os.access(parent, os.W_OK):
                raise UsageError(f"{setting}: {parent} is not writable")
            break
    return resolved


def env_id(value: str, setting: str = "--env") -> str:
    """``value`` when it is a registered Gymnasium env id (rapo's envs registered first)."""
    import gymnasium as gym

    import rapo_env

    if value not in gym.registry:
        raise UsageError(f"{setting}: {value!r} is not a registered env; use one of {', '.join(rapo_env.RAPO_ENV_IDS)}"
                         " (`rapo envs` lists them)")
    return value


def dataset(value: Any, setting: str) -> None:
    """A ``dataset`` that names a task file must exist; names (``procedural``, ``hf:...``, benchmarks) pass."""
    if isinstance(value, str) and value.lower().endswith(TASK_FILE_SUFFIXES):
        existing_file(value, setting, "give an existing JSONL/JSON/parquet task file, or leave it out for the "
                                      "generated default (`rapo envs` lists each env's datasets)")


def env_kwargs(text: str, setting: str = "--env-kwargs") -> dict[str, Any]:
    """The JSON object ``text`` as a dict, its ``dataset`` checked."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{setting} is not valid JSON ({error}); write e.g. '{{\"dataset\": \"procedural\"}}'") \
            from None
    if not isinstance(value, dict):
        raise UsageError(f"{setting} must be a JSON object such as '{{\"dataset\": \"procedural\"}}', got {text}")
    dataset(value.get("dataset"), f"{setting} dataset")
    return value


def model(value: str | None, setting: str) -> None:
    """A model or tokenizer: ``embedded``/None, a local folder or file, or a hub id (offline: one in the HF cache)."""
    if value is None:
        return
    from rapo_tools.models import is_embedded, require_embedded_packages

    if is_embedded(value):
        require_embedded_packages()
        return
    if Path(value).expanduser().exists():
        return
    looks_like_path = value.startswith(("/", ".", "~")) or value.count("/") > 1
    if looks_like_path:
        raise UsageError(f"{setting}: no model folder at {value}; give an existing folder, a hub id, or `embedded` "
                         "(SmolLM2-135M-Instruct, offline)")
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") and not _in_hf_cache(value):
        raise UsageError(f"{setting}: {value!r} is not a local folder and is not in the Hugging Face cache, and "
                         "HF_HUB_OFFLINE is set; download it first, or use `embedded` (SmolLM2-135M-Instruct)")


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def policy(args: Any) -> None:
    """The ``--policy``/``--model``/``--base-url``/``--tokenizer`` options of `add_policy_arguments`, together."""
    kind = args.policy
    if kind == "openai":
        if not args.base_url:
            raise UsageError("--policy openai needs --base-url, e.g. --base-url http://127.0.0.1:8000/v1")
        model(args.tokenizer, "--tokenizer")
        return
    if kind == "vllm" and not args.model:
        raise UsageError("--policy vllm needs --model (a model folder or hub id)")
    if kind in ("hf", "vllm"):
        model(args.model, "--model")
