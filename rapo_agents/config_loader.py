"""The command line's way to a `TrainConfig`: a YAML file, then ``key=value`` overrides, then the machine checks.

Keys are dotted paths (``optim.lr=1e-6``). The seed's knob names (``rollout_n``, ``no_retrieve_first_k``,
``retrieve_prob``, ``shaping_weight``, ``advantage_weight``) and every other leaf name that is unique in the tree
also work bare (``rollout_n=16``), as do the names TRL and verl users type (`ALIASES`). Values are read as YAML
(``true``, ``1e-6``, ``[0.9, 0.999]``, ``null``) and typed by the schema (`rapo_agents.config`).

Example:
    >>> config = load_config(None, ["rollout_n=8", "optim.lr=2e-6", "retrieval.enabled=false"])
    >>> config.rollout.rollout_n, config.optim.lr, config.retrieval.enabled
    (8, 2e-06, False)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rapo_agents.config import TrainConfig, check_data_source
from rapo_agents.settings import ConfigError, field_types, settings_from_dict

ALIASES: dict[str, str] = {
    # TRL (GRPOConfig / TrainingArguments)
    "learning_rate": "optim.lr",
    "num_generations": "rollout.rollout_n",
    "per_device_train_batch_size": "optim.micro_batch_size",
    "max_grad_norm": "optim.grad_clip",
    "max_steps": "optim.total_steps",
    "num_train_epochs": "optim.total_epochs",
    "max_completion_length": "rollout.max_response_tokens",
    "max_prompt_length": "rollout.max_prompt_tokens",
    "model_name_or_path": "model.path",
    "num_iterations": "optim.ppo_epochs",
    # verl (ppo_trainer.yaml)
    "actor_rollout_ref.rollout.n": "rollout.rollout_n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "actor_rollout_ref.actor.optim.lr": "optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "optim.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "optim.micro_batch_size",
    "actor_rollout_ref.actor.ppo_epochs": "optim.ppo_epochs",
    "actor_rollout_ref.actor.grad_clip": "optim.grad_clip",
    "actor_rollout_ref.actor.clip_ratio_low": "algorithm.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "algorithm.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "algorithm.clip_ratio_c",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl_coef",
    "actor_rollout_ref.model.path": "model.path",
    "data.train_batch_size": "optim.train_batch_size",
    "data.max_prompt_length": "rollout.max_prompt_tokens",
    "data.max_response_length": "rollout.max_response_tokens",
    "data.train_files": "data.source",
    "trainer.total_training_steps": "optim.total_steps",
    "trainer.total_epochs": "optim.total_epochs",
    "trainer.default_local_dir": "logging.output_dir",
    "trainer.save_freq": "logging.save_every",
    "trainer.project_name": "logging.project",
}
"""Names that TRL and verl users type, accepted for the same rapo settings (``learning_rate=1e-6``)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "device": ("auto", "cpu", "cuda"),
}
"""Allowed values of string settings that `TrainConfig` does not check itself (``cuda:N`` is a ``cuda``)."""


def _setting(config: TrainConfig, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def check_config(config: TrainConfig) -> None:
    """What `TrainConfig` cannot check without looking at the machine: files, the env registry, the model,
    and the values of `CHOICES`. The ``rapo train`` command runs it before any work starts.

    Raises:
        ConfigError: naming the setting and the fix.
    """
    import gymnasium as gym

    import rapo_env
    from rapo_tools.models import is_embedded, require_embedded_packages

    check_data_source(config.data.source)
    for path, allowed in CHOICES.items():
        value = str(_setting(config, path)).lower()
        if value.split(":", 1)[0] not in allowed:
            raise ConfigError(f"{path} must be one of {', '.join(allowed)}, got {_setting(config, path)!r}")
    if config.data.env_id not in gym.registry:
        raise ConfigError(f"data.env_id: {config.data.env_id!r} is not a registered env; use one of "
                          f"{', '.join(rapo_env.RAPO_ENV_IDS)}")
    model = config.model.path
    if is_embedded(model):
        require_embedded_packages()
    elif model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
        raise ConfigError(f"model.path: no model folder at {model}; give a folder, a hub id, or embedded")
    retrieval = config.retrieval
    if retrieval.enabled and not retrieval.retriever.startswith(("http://", "https://")):
        if retrieval.retriever != "default" and not Path(retrieval.retriever).expanduser().is_file():
            raise ConfigError(f"retrieval.retriever: no buffer JSONL at {retrieval.retriever}; give `default`, a "
                              "buffer JSONL (`rapo buffer build`) or a /retrieve URL")
        if retrieval.index_path and not Path(retrieval.index_path).expanduser().is_file():
            raise ConfigError(f"retrieval.index_path: no index at {retrieval.index_path}; build it with "
                              "`rapo buffer index`")
    output = Path(config.logging.output_dir).expanduser()
    if output.exists() and not output.is_dir():
        raise ConfigError(f"logging.output_dir: {output} is a file; give a folder for the run")



def leaf_types(cls: type = TrainConfig, prefix: str = "") -> dict[str, Any]:
    """Every settable dotted key of a config class, with its type annotation."""
    types: dict[str, Any] = {}
    for name, annotation in field_types(cls).items():
        if dataclasses.is_dataclass(annotation):
            types |= leaf_types(annotation, f"{prefix}{name}.")
        else:
            types[prefix + name] = annotation
    return types


def leaf_paths(cls: type = TrainConfig) -> list[str]:
    """Every settable dotted key of a config class.

    Example:
        >>> "rollout.rollout_n" in leaf_paths()
        True
    """
    return list(leaf_types(cls))


def mapping_paths(cls: type = TrainConfig) -> list[str]:
    """The dotted keys of the settings that hold a mapping (``data.env_kwargs``), into which an override may
    reach: ``data.env_kwargs.hops=[2]``.

    Example:
        >>> "data.env_kwargs" in mapping_paths()
        True
    """
    return [path for path, annotation in leaf_types(cls).items() if typing.get_origin(annotation) is dict]


def resolve_key(key: str) -> str:
    """The full dotted path of ``key``: itself when it is one or lies inside a mapping setting, else the unique
    leaf with that name.

    Raises:
        ConfigError: for a key that matches no setting or several.
    """
    paths = leaf_paths()
    if key in paths or any(key.startswith(f"{mapping}.") for mapping in mapping_paths()):
        return key
    if key in ALIASES:
        return ALIASES[key]
    matches = [path for path in paths if path.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{key!r} is ambiguous: use one of {matches}")
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ALIASES:  # optim.learning_rate: a known name under a guessed section
        close = [ALIASES[leaf]]
    else:
        close = difflib.get_close_matches(key, paths + [path.rsplit(".", 1)[-1] for path in paths], n=3)
    raise ConfigError(f"unknown setting {key!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
                      + " (`rapo train --help` lists every setting)")


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "rollout_n=8"]`` into a nested dict ``{"a": {"b": 1}, "rollout": {"rollout_n": 8}}``.

    Raises:
        ConfigError: for an item without ``=`` or an unknown key.
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        key, separator, raw = item.partition("=")
        if not separator or not key.strip():
            raise ConfigError(f"overrides look like key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        *parents, leaf = resolve_key(key.strip()).split(".")
        section = nested
        for parent in parents:
            section = section.setdefault(parent, {})
        section[leaf] = value
    return nested


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> TrainConfig:
    """Defaults, then the YAML file at ``path`` (if any), then the ``key=value`` overrides.

    Raises:
        ConfigError: for unknown keys, wrongly typed values, or a file that is not a YAML mapping.
        FileNotFoundError: when ``path`` does not exist.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ConfigError(f"{path} is not valid YAML: {error}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of settings, got {type(loaded).__name__}")
        data = loaded or {}
    data = _merge(data, parse_overrides(overrides))
    return settings_from_dict(TrainConfig, data)
