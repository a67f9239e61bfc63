"""The trained model of a run: loading, freezing (or LoRA adapters), gradient checkpointing, autocast and the KL
reference.

`RAPOTrainer` builds its model with these functions from ``config.model`` (`rapo_agents.config.ModelConfig`);
each takes what it needs as arguments, so another loop can reuse them.

Example:
    >>> resolve_flag("auto", on_gpu=False), resolve_flag("true", on_gpu=False)
    (False, True)
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from rapo_agents.config import ModelConfig
from rapo_agents.lora import add_adapter


def resolve_flag(setting: str, on_gpu: bool) -> bool:
    """An ``auto``/``true``/``false`` setting as a bool (``auto``: on GPU only)."""
    return on_gpu if setting == "auto" else setting == "true"


def load_model_and_tokenizer(config: ModelConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """The trainable causal LM and its tokenizer (``embedded`` = SmolLM2-135M-Instruct)."""
    from rapo_agents.policies.hf import default_policy_path, load_pretrained

    path = default_policy_path() if config.path == "embedded" else config.path
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    model, tokenizer = load_pretrained(path, dtype=dtype, gguf_file=config.gguf_file)
    return model.to(device), tokenizer


def last_layers(model: torch.nn.Module, count: int) -> list[int] | None:
    """Indices of the last ``count`` decoder layers of ``model``, or None when that is all of them.

    Raises:
        ValueError: when ``count`` is below 1 or the model has no ``layers`` list.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"model.trainable_layers needs a decoder with a layers list; {type(model).__name__} has none")
    if count < 1:
        raise ValueError(f"model.trainable_layers must be >= 1 (or None for the whole model), got {count}")
    return None if count >= len(layers) else list(range(len(layers) - count, len(layers)))


def freeze_all_but_last_layers(model: torch.nn.Module, count: int) -> None:
    """Leave only the last ``count`` decoder layers and the final norm trainable (embeddings and any tied
    ``lm_head`` frozen); a ``count`` of at least the number of layers leaves the whole model trainable.

    Raises:
        ValueError: when ``count`` is below 1 or the model has no ``layers`` list.
    """
    trainable = last_layers(model, count)
    if trainable is None:
        model.requires_grad_(True)
        return
    decoder = model.get_decoder()
    model.requires_grad_(False)
    for index in trainable:
        decoder.layers[index].requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def trainable_model(config: ModelConfig, device: torch.device, model: torch.nn.Module | None = None,
                    tokenizer: Any = None) -> tuple[torch.nn.Module, Any]:
    """``model`` (or the one ``config`` names, loaded) on ``device``, frozen but for ``config.trainable_layers``
    (or, with ``config.lora`` on, wrapped in LoRA adapters on those layers), with gradient checkpointing as
    ``config`` says.

    Raises:
        ValueError: for a ``model`` given without its tokenizer.
    """
    if model is None:
        model, tokenizer = load_model_and_tokenizer(config, device)
    elif tokenizer is None:
        raise ValueError("pass the tokenizer together with the model")
    model = model.to(device)
    if config.lora.enabled:
        layers = None if config.trainable_layers is None else last_layers(model, config.trainable_layers)
        model = add_adapter(model, config.lora, layers)
    elif config.trainable_layers is not None:
        freeze_all_but_last_layers(model, config.trainable_layers)
    if resolve_flag(config.gradient_checkpointing, device.type == "cuda"):
        model.gradient_checkpointing_enable()
        if config.lora.enabled:  # frozen embeddings: checkpointed layers need an input that asks for gradients
            model.enable_input_require_grads()
    return model, tokenizer


def autocast_dtype(config: ModelConfig, device: torch.device) -> torch.dtype | None:
    """The dtype of the forward passes' autocast (bfloat16), or None without autocast."""
    return torch.bfloat16 if resolve_flag(config.bf16_autocast, device.type == "cuda") else None


def reference_model(model: torch.nn.Module, kl_coef: float) -> torch.nn.Module | None:
    """A frozen copy of ``model`` for the KL term, or None when ``kl_coef`` is 0 (no copy is paid for)."""
    return copy.deepcopy(model).eval().requires_grad_(False) if kl_coef > 0 else None


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad token, else its end-of-sequence token (what collation pads with)."""
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)
