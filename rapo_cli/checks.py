"""Up-front checks of the ``rapo`` commands' inputs: every path and name is checked before any work starts.

Each check raises `UsageError` with one line that names the option and the fix, so a missing file is
reported in a second, not after a model load or a thousand scripted episodes.

Example:
    >>> env_kwargs('{"dataset": "procedural"}')
    {'dataset': 'procedural'}
    >>> env_kwargs('{"datset": "procedural"}', env="RAPO-Math-v0")
    Traceback (most recent call last):
    ...
    rapo_cli.errors.UsageError: --env-kwargs: RAPO-Math-v0 takes no argument 'datset'; did you mean 'dataset'?
    >>> existing_file("/nope/train.jsonl", "--input")
    Traceback (most recent call last):
    ...
    rapo_cli.errors.UsageError: --input: no file at /nope/train.jsonl
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
from pathlib import Path
from typing import Any

from rapo_cli.errors import UsageError

GYM_MAKE_ARGUMENTS = frozenset({"max_episode_steps", "autoreset", "disable_env_checker", "apply_api_compatibility"})
"""Keyword arguments that ``gym.make`` itself takes, whatever the env."""

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


def env_arguments(env: str) -> set[str] | None:
    """The keyword arguments that ``gym.make(env, ...)`` accepts (None: any, the env takes ``**kwargs`` to the end).

    The env class's ``__init__`` and those of its bases that it forwards ``**kwargs`` to are read.
    """
    import gymnasium as gym

    import rapo_env  # noqa: F401  (registers rapo's envs)

    spec = gym.registry.get(env)
    if spec is None:
        return None
    entry = spec.entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(__import__(module, fromlist=[name]), name)
    names: set[str] = set()
    for cls in (entry.__mro__ if inspect.isclass(entry) else [entry]):
        init = cls.__init__ if inspect.isclass(cls) else cls
        if init is object.__init__:
            return names
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return names | {"render_mode"}  # gym.make passes it
        if not inspect.isclass(entry):
            return None
    return None


def known_env_arguments(kwargs: dict[str, Any], env: str, setting: str = "--env-kwargs") -> None:
    """Every key of ``kwargs`` is an argument of ``env``; a typo is named with the closest argument."""
    accepted = env_arguments(env)
    if accepted is None:
        return
    accepted |= GYM_MAKE_ARGUMENTS
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(sorted(accepted))}"
            raise UsageError(f"{setting}: {env} takes no argument {key!r}{hint}")


def json_object(text: str, setting: str, example: str) -> dict[str, Any]:
    """The JSON object ``text`` as a dict; `UsageError` shows ``example`` (a JSON object) when it is not one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{setting} is not valid JSON ({error}); write e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"{setting} must be a JSON object such as '{example}', got {text}")
    return value


def env_kwargs(text: str, setting: str = "--env-kwargs", env: str | None = None) -> dict[str, Any]:
    """The JSON object ``text`` as a dict, its keys checked against ``env``'s arguments and its ``dataset``
    checked."""
    value = json_object(text, setting, '{"dataset": "procedural"}')
    if env is not None:
        known_env_arguments(value, env, setting)
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
        raise UsageError(f"{setting}: no model folder at {value}, and {value!r} is no hub id in the Hugging Face "
                         "cache (the hub is offline; HF_HUB_OFFLINE=0 downloads); give an existing folder, or "
                         "`embedded` (SmolLM2-135M-Instruct)")


def model_folder(value: str | None, setting: str = "--model") -> None:
    """A model to load: as `model`, and a local folder must hold a model (its ``config.json``) or a LoRA checkpoint
    of a rapo run (its adapter)."""
    from rapo_agents.lora import has_adapter

    model(value, setting)
    if value is None:
        return
    folder = Path(value).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file() and not has_adapter(folder):
        checkpoints = sorted((folder / "checkpoints").glob("step_*")) if (folder / "checkpoints").is_dir() else []
        fix = (f"it is a run folder: give one of its checkpoints, e.g. {checkpoints[-1]}" if checkpoints
               else "give a folder that save_pretrained wrote (a checkpoint step_* folder, an export), a hub id, "
                    "or `embedded`")
        raise UsageError(f"{setting}: {value} holds no model (no config.json); {fix}")


def endpoint(base_url: str, setting: str = "--base-url", timeout_s: float = 10.0, model: str | None = None) -> None:
    """An OpenAI-compatible endpoint answers ``GET {base_url}/models`` (checked before the first question), and
    serves ``model`` when one is named (``--model``)."""
    import httpx

    url = base_url.rstrip("/") + "/models"
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise UsageError(f"{setting}: no OpenAI-compatible server answers at {base_url} ({type(error).__name__}: "
                         f"{' '.join(str(error).split()) or 'no answer'}); start one (vLLM, or `python -m "
                         "rapo_agents.policies.openai_server`) or fix the URL") from None
    if response.status_code >= 400:
        raise UsageError(f"{setting}: {url} answered HTTP {response.status_code}; is {base_url} the API root of an "
                         "OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1)?")
    served = served_models(response)
    if model is not None and served and model not in served:
        raise UsageError(f"--model: {base_url} serves no model {model!r}; it serves {', '.join(map(repr, served))} "
                         "(or leave --model out for the first of them)")


def served_models(response: Any) -> list[str]:
    """The model ids of a ``GET /models`` answer ([] when it lists none in OpenAI's form)."""
    try:
        entries = response.json().get("data")
    except (ValueError, AttributeError):
        return []
    return [entry["id"] for entry in entries or [] if isinstance(entry, dict) and isinstance(entry.get("id"), str)]


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
        endpoint(args.base_url, model=args.model)  # a dead endpoint or a wrong model id, before the first question
        return
    if kind == "vllm" and not args.model:
        raise UsageError("--policy vllm needs --model (a model folder or hub id)")
    if kind in ("hf", "vllm"):
        model_folder(args.model, "--model")
