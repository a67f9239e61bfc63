"""LoRA adapters on the trained model (``model.lora``, with ``peft``): add them, merge them, save and load them.

With ``model.lora.r > 0`` the trainer wraps its model in a ``peft`` LoRA adapter and every update (the warm-up's and
RL's) trains the adapter only. Everything that reads the weights out of the trained module takes them through
`merged_weights`, so that a rollout policy (`FastPolicy`'s repack, `HFPolicy`, vLLM, Ray replicas) always decodes
``W + (alpha / r) * B @ A`` under the base model's names, and never knows an adapter exists. A checkpoint of a
LoRA run holds the adapter (``adapter_model.safetensors`` and ``adapter_config.json``, a few MB) beside the trainer
state; `load_adapted` rebuilds the trained model from it and its run's base model, and `rapo export` merges it into a
plain model folder.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    >>> adapted = add_adapter(model, LoraSettings(r=4, alpha=8))
    >>> sorted({name.split(".")[-2] for name, p in adapted.named_parameters() if p.requires_grad})
    ['default']
    >>> weights = merged_weights(adapted)  # the base model's names, adapter merged
    >>> "model.layers.0.self_attn.q_proj.weight" in weights, any("lora" in name for name in weights)
    (True, False)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

ADAPTER_FILE = "adapter_model.safetensors"
"""The adapter's weights in a checkpoint folder (``peft``'s file name)."""
ADAPTER_CONFIG_FILE = "adapter_config.json"
"""The adapter's settings in a checkpoint folder (``peft``'s file name)."""
LLAMA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama decoder layer: the default ``target_modules``."""


@dataclasses.dataclass
class LoraSettings:
    """LoRA of the trained model (``model.lora``); ``r = 0`` is full fine-tuning, the default."""

    r: int = 0
    """Rank of each adapter (0: no adapter, full fine-tuning; 8-64 are usual)."""
    alpha: float = 16.0
    """Scale numerator: the update is ``(alpha / r) * B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapters' input during training."""
    target_modules: list[str] = dataclasses.field(default_factory=lambda: list(LLAMA_LINEAR_MODULES))
    """Names of the linear layers that get an adapter (default: all seven of a Llama layer)."""

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ValueError(f"model.lora.r must be >= 0 (0: full fine-tuning), got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if self.r and not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name the linear layers to adapt (e.g. q_proj)")

    @property
    def enabled(self) -> bool:
        """Whether the model gets an adapter."""
        return self.r > 0


def is_adapted(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` model (carries an adapter)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def add_adapter(model: torch.nn.Module, settings: LoraSettings, layers: list[int] | None = None) -> torch.nn.Module:
    """``model`` wrapped in a fresh LoRA adapter (``B = 0``: the same outputs as before), only the adapter trainable.

    Args:
        layers: indices of the decoder layers that get adapters (None: all), how ``model.trainable_layers`` keeps
            the backward pass shallow.

    Raises:
        ValueError: when none of ``settings.target_modules`` is a layer of ``model``.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), layers_to_transform=layers,
                        task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"model.lora.target_modules {settings.target_modules} do not fit this model: {error}"
                         ) from error


def merged_weights(source: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plain weights of a module (or a state dict, as it is): for an adapted model, the base model's names with
    each adapter merged in (``W + scale * B @ A``), computed aside so that the trained module is untouched.

    This is what a weight sync sends to a rollout policy (`FastPolicy`, `HFPolicy`, vLLM, Ray replicas).
    """
    if not isinstance(source, torch.nn.Module):
        return dict(source)
    if not is_adapted(source):
        return source.state_dict()
    from peft.tuners.lora import LoraLayer

    base = source.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                delta = sum(module.get_delta_weight(adapter) for adapter in module.active_adapters
                            if adapter in module.lora_A)
                deltas[f"{name}.weight"] = module.get_base_layer().weight + delta
        weights = {}
        for name, tensor in base.state_dict().items():
            if ".lora_" in name:
                continue
            plain = name.replace(".base_layer.", ".")
            weights[plain] = deltas.get(plain, tensor)
    return weights


def unwrapped(model: Any) -> Any:
    """The transformers model inside an adapted ``model`` (its adapter layers in place, so it computes the same
    outputs under the base model's module names), or ``model`` itself."""
    return model.get_base_model() if is_adapted(model) else model


def adapter_trainable(model: torch.nn.Module) -> None:
    """Make only the adapter's parameters trainable (what every update of an adapted model trains)."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)


def has_adapter(folder: str | os.PathLike[str]) -> bool:
    """Whether a checkpoint (or model) folder holds a LoRA adapter rather than full weights."""
    return (Path(folder) / ADAPTER_FILE).is_file() and (Path(folder) / ADAPTER_CONFIG_FILE).is_file()


def load_adapter_weights(model: torch.nn.Module, folder: str | os.PathLike[str]) -> None:
    """Load a checkpoint folder's adapter weights into the adapted ``model``.

    Raises:
        ValueError: when the file cannot be read or does not fit ``model``'s adapter.
    """
    from peft import set_peft_model_state_dict
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = Path(folder) / ADAPTER_FILE
    try:
        weights = load_file(file, device=str(next(model.parameters()).device))
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise ValueError(f"cannot read the adapter {file}: {error}") from error
    result = set_peft_model_state_dict(model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [key for key in getattr(result, "missing_keys", []) or [] if ".lora_" in key]
    if unexpected or missing:
        raise ValueError(f"{file} does not fit the model's adapter: missing {missing[:5]}, unexpected {unexpected[:5]}")


def adapter_settings(folder: str | os.PathLike[str]) -> tuple[LoraSettings, list[int] | None]:
    """The `LoraSettings` and adapted layers that ``folder``'s ``adapter_config.json`` records.

    Raises:
        ValueError: when the file is unreadable or is not a LoRA adapter's.
    """
    file = Path(folder) / ADAPTER_CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
        if config.get("peft_type") != "LORA":
            raise ValueError(f"peft_type is {config.get('peft_type')!r}, not LORA")
        modules = config["target_modules"]
        settings = LoraSettings(r=int(config["r"]), alpha=float(config["lora_alpha"]),
                                dropout=float(config.get("lora_dropout") or 0.0),
                                target_modules=sorted(modules) if isinstance(modules, list) else [modules])
        layers = config.get("layers_to_transform")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read the adapter settings {file}: {error}") from error
    return settings, ([layers] if isinstance(layers, int) else layers)


def base_model_path(folder: str | os.PathLike[str]) -> str:
    """The base model folder or hub id of the LoRA checkpoint ``folder``: its run's ``model.path`` (``embedded``
    resolved), else what ``adapter_config.json`` names.

    Raises:
        ValueError: when neither says.
    """
    from rapo_agents.checkpoint import trained_config

    run = trained_config(folder)
    if run is not None:
        from rapo_agents.policies.hf import default_policy_path

        return default_policy_path() if run.model.path == "embedded" else run.model.path
    try:
        named = json.loads((Path(folder) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{folder}: cannot tell the adapter's base model ({error})") from error
    if not named:
        raise ValueError(f"{folder}: the adapter's config names no base model")
    return str(named)


def load_adapted(folder: str | os.PathLike[str], device: torch.device | str = "cpu") -> tuple[torch.nn.Module, Any]:
    """The model a LoRA checkpoint ``folder`` holds, and its tokenizer: its run's base model (the checkpoint's
    ``trainer_state.json`` says which) with the adapter loaded and merged, a plain transformers model.

    Raises:
        ValueError: when ``folder`` holds no adapter, or its base model or adapter cannot be loaded.
    """
    from rapo_agents.checkpoint import trained_config
    from rapo_agents.model import load_model_and_tokenizer

    if not has_adapter(folder):
        raise ValueError(f"{folder} holds no LoRA adapter ({ADAPTER_FILE} and {ADAPTER_CONFIG_FILE})")
    run = trained_config(folder)
    if run is None:
        raise ValueError(f"{folder} holds an adapter but no readable trainer_state.json naming its base model: "
                         "pass the checkpoint folder that rapo train wrote")
    settings, layers = adapter_settings(folder)
    base = dataclasses.replace(run.model, lora=LoraSettings())  # the base model alone: the adapter is added below
    model, tokenizer = load_model_and_tokenizer(base, torch.device(device))
    model = add_adapter(model, settings, layers)
    load_adapter_weights(model, folder)
    return model.merge_and_unload().eval(), tokenizer
