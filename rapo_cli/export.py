"""``rapo export``: copy a training checkpoint's policy to a plain Hugging Face model folder.

A checkpoint (``runs/rapo/checkpoints/step_000012``) already holds the policy as ``save_pretrained`` writes it,
beside the trainer's state (a LoRA run's holds its adapter: the export merges it into the run's base model). The
export keeps the model and tokenizer files only, checks that plain
``transformers.AutoModelForCausalLM.from_pretrained`` loads the result, and prints how to use it. A run folder
stands for its newest checkpoint. The folder also says how the model was prompted, so that a plain ``generate``
stops where rapo's rollouts stopped: ``rapo_prompt.json`` (the system prompt, the tool tags, the stop strings and
the tool-result format), the stop strings in ``generation_config.json`` (``stop_strings``), and a ``README.md``.
Every file is readable by all (0644). Examples::

    rapo export runs/rapo/checkpoints/step_000012 exported/rapo-smollm2
    rapo export runs/rapo exported/rapo-smollm2            # the run's newest checkpoint
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from rapo_cli.errors import UsageError

HELP = "Export a checkpoint's policy as a Hugging Face model folder (transformers and vLLM load it)."

TRAINER_FILES = ("trainer_state.pt", "trainer_state.json")
"""Files of a checkpoint that belong to the trainer, not to the model."""
PROMPT_FILE = "rapo_prompt.json"
"""How the exported model was prompted: system prompt, tool tags, stop strings, tool-result format."""
FILE_MODE = 0o644
"""Mode of every exported file: a model folder is shared, so readable by all."""


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
    from rapo_agents.lora import has_adapter

    def holds_policy(folder: Path) -> bool:
        return (folder / WEIGHTS_FILE).is_file() or has_adapter(folder)

    folder = Path(path)
    if holds_policy(folder):
        return folder
    for candidate in (folder / "checkpoints", folder):
        latest = CheckpointManager(candidate).latest()
        if latest is not None and holds_policy(latest):
            return latest
    raise UsageError(f"{path} holds no checkpoint with {WEIGHTS_FILE} (or a LoRA adapter): pass a step_* folder of "
                     "a run's checkpoints/ or the run folder itself (e.g. runs/rapo)")


def prompt_card(checkpoint: Path) -> dict[str, Any]:
    """How the run that wrote ``checkpoint`` prompted its policy: the env's system prompt and tool tags (built from
    the run's question settings only, as `rapo eval` takes them), the stop strings and the tool-result format.

    Example:
        >>> card = prompt_card(Path("/nonexistent"))  # no run config: the default RAPO-Math-v0  # doctest: +SKIP
        >>> card["stop_strings"]  # doctest: +SKIP
        ['</python>', '</answer>']
    """
    import gymnasium as gym

    import rapo_env  # noqa: F401  (registers the envs)
    from rapo_agents.checkpoint import trained_config
    from rapo_agents.trainer import training_env_kwargs
    from rapo_cli.eval import CHECKPOINT_ENV_SETTINGS
    from rapo_env.protocol import closing_tags

    config = trained_config(checkpoint)
    env_id = config.data.env_id if config is not None else "RAPO-Math-v0"
    kwargs = {k: v for k, v in training_env_kwargs(config).items() if k in CHECKPOINT_ENV_SETTINGS} if config else {}
    env = gym.make(env_id, **kwargs)
    try:
        system_prompt, tags = env.unwrapped.system_prompt, list(env.unwrapped.tool_tags)
    finally:
        env.close()
    return {
        "env": env_id, "env_kwargs": kwargs, "system_prompt": system_prompt, "tool_tags": tags,
        "stop_strings": closing_tags(tags),
        "tool_result_format": " <result>\n{tool output}\n</result>",
        "how": "chat template with this system prompt and the question as the user turn; generate until a stop "
               "string; run the last tool call, append its result in tool_result_format to the same assistant "
               "turn, and generate again, until </answer>",
    }


def write_prompt_files(target: Path, card: dict[str, Any]) -> None:
    """``rapo_prompt.json``, the stop strings in ``generation_config.json`` and a ``README.md`` in ``target``."""
    (target / PROMPT_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    generation_file = target / "generation_config.json"
    generation = json.loads(generation_file.read_text(encoding="utf-8")) if generation_file.is_file() else {}
    generation["stop_strings"] = card["stop_strings"]
    generation_file.write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    stops = ", ".join(f"`{stop}`" for stop in card["stop_strings"])
    result_format = json.dumps(card["tool_result_format"])
    tags = ", ".join(f"<{tag}>" for tag in card["tool_tags"])
    (target / "README.md").write_text(f"""# A rapo policy ({card["env"]})

Trained with rapo to call tools by tags ({tags}) and answer in
`<answer>...</answer>`. Prompt it as it was trained: the system prompt in `{PROMPT_FILE}`, the question as the user
turn, and generation stopped at {stops} (`generation_config.json` holds them as `stop_strings`: pass
`tokenizer=` to `generate`). After a tool call, run the tool and append its output as
`{result_format}` (a JSON string) to the same assistant turn, then generate again.

```python
import json
from transformers import AutoModelForCausalLM, AutoTokenizer

model, tokenizer = AutoModelForCausalLM.from_pretrained("."), AutoTokenizer.from_pretrained(".")
card = json.load(open("{PROMPT_FILE}"))
messages = [{{"role": "system", "content": card["system_prompt"]}}, {{"role": "user", "content": "What is 37 * 248?"}}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)["input_ids"]
out = model.generate(ids, max_new_tokens=256, tokenizer=tokenizer)  # stops after the tool call
print(tokenizer.decode(out[0, ids.shape[1]:]))
```

`rapo eval --policy hf --model <this folder>` plays it in rapo's envs with the tools.
""", encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    from rapo_agents.lora import has_adapter, load_adapted

    source = resolve_checkpoint(args.checkpoint)
    target = Path(args.out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} exists and is not an empty folder: choose a new out_dir")
    target.mkdir(parents=True, exist_ok=True)
    if has_adapter(source):  # a LoRA run: its base model with the adapter merged in, as a plain model
        try:
            model, tokenizer = load_adapted(source)
        except ValueError as error:
            raise UsageError(f"cannot merge the LoRA checkpoint {source}: {error}") from None
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
    else:
        for file in sorted(source.iterdir()):
            if file.is_file() and file.name not in TRAINER_FILES:
                shutil.copy2(file, target / file.name)
    write_prompt_files(target, prompt_card(source))
    for file in target.iterdir():
        file.chmod(FILE_MODE)
    if not args.no_check:
        from rapo_agents.policies.hf import ModelFileError, load_pretrained

        try:
            load_pretrained(str(target))
        except ModelFileError as error:
            shutil.rmtree(target)
            raise UsageError(f"{source} does not load as a model ({error.__cause__}), so "
                             "nothing was exported: export another checkpoint of the run (its checkpoints/ folder) "
                             "or train again") from None
    print(f"exported {source} -> {target} (with {PROMPT_FILE}: the system prompt and stop strings it was trained "
          "with; README.md says how to prompt it)")
    print(f"load it with AutoModelForCausalLM.from_pretrained({str(target)!r}), serve it with vLLM, or evaluate it "
          f"with: rapo eval --policy hf --model {target}")
    return 0
