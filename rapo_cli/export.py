"""``rapo export``: copy a training checkpoint's policy to a plain Hugging Face model folder.

A checkpoint (``runs/rapo/checkpoints/step_000012``) already holds the policy as ``save_pretrained`` writes it,
beside the trainer's state. The export keeps the model and tokenizer files only, checks that plain
``transformers.AutoModelForCausalLM.from_pretrained`` loads the result, and prints how to use it. A run folder
stands for its newest checkpoint. Examples::

    rapo export runs/rapo/checkpoints/step_000012 exported/rapo-smollm2
    rapo export runs/rapo exported/rapo-smollm2            # the run's newest checkpoint
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rapo_cli.errors import UsageError

HELP = "Export a checkpoint's policy as a Hugging Face model folder (transformers and vLLM load it)."

TRAINER_FILES = ("trainer_state.pt", "trainer_state.json")
"""Files of a checkpoint that belong to the trainer, not to the model."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (step_*) or a run folder (its newest checkpoint)")
    parser.add_argument("out_dir", help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--no-check", action="store_true", help="skip loading the export with transformers")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint or run folder.

    Raises:
        UsageError: when ``path`` is neither.
    """
    from rapo_agents.checkpoint import WEIGHTS_FILE, CheckpointManager

    folder = Path(path)
    if (folder / WEIGHTS_FILE).is_file():
        return folder
    for candidate in (folder / "checkpoints", folder):
        latest = CheckpointManager(candidate).latest()
        if latest is not None and (latest / WEIGHTS_FILE).is_file():
            return latest
    raise UsageError(f"{path} holds no checkpoint with {WEIGHTS_FILE}: pass a step_* folder of a run's "
                     "checkpoints/ or the run folder itself (e.g. runs/rapo)")


def run(args: argparse.Namespace) -> int:
    source = resolve_checkpoint(args.checkpoint)
    target = Path(args.out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} exists and is not an empty folder: choose a new out_dir")
    target.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and file.name not in TRAINER_FILES:
            shutil.copy2(file, target / file.name)
    if not args.no_check:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoModelForCausalLM.from_pretrained(target)
        AutoTokenizer.from_pretrained(target)
    print(f"exported {source} -> {target}")
    print(f"load it with AutoModelForCausalLM.from_pretrained({str(target)!r}), serve it with vLLM, or evaluate it "
          f"with: rapo eval --policy hf --model {target}")
    return 0
