"""``RAPO-Math-v0``: math word problems solved with a sandboxed Python interpreter.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> env = gym.make("RAPO-Math-v0", num_tasks=4, sandbox="subprocess")
    >>> prompt, info = env.reset(seed=0)
    >>> info["tools"]
    ['python']
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_env.core import ToolEnv
from rapo_env.envs.reward_spec import RewardSpec, resolve_reward
from rapo_env.prompts import SHORT_MATH_PROMPT, TOOL_DESCRIPTIONS, build_system_prompt
from rapo_env.tasks import Task, resolve_tasks
from rapo_env.tasks.procedural_math import SPLIT_SEEDS, ProceduralMath
from rapo_tools.python_tool import PythonTool
from rapo_tools.sandbox import SandboxConfig

MATH_REWARDS = ("math_verify", "reference")


class MathEnv(ToolEnv):
    """Math problems with the ``<python>`` tool.

    Args:
        dataset: ``"procedural"`` (default: generated word problems), a JSONL/JSON/parquet file in the
            formats of GSM8K, MATH500, AIME or the reference's RL parquet, ``"hf:<name>"``, or a task list.
        split: ``train``/``validation``/``test`` for procedural problems; the split for ``hf:`` datasets.
        reward: ``"math_verify"`` (answer equivalence, default), ``"reference"`` (spec §2: format
            penalty, token F1, multi-tool bonus), or a callable ``(response, task) -> Score``.
        sandbox: Python sandbox settings (a `SandboxConfig`, a dict, or a backend name).
        num_tasks: Number of procedural problems.
        difficulty: Operations per procedural problem (1-5), or None for a mix.
        ability: For mixed RL parquet files, keep rows of this ``ability`` (default ``"math"``).
        limit: Keep at most this many tasks of a file.
        system_prompt: Overrides the default prompt that explains the tags; ``"short"`` is
            `rapo_env.prompts.SHORT_MATH_PROMPT`, the same protocol in three sentences.
        **kwargs: Passed to `ToolEnv` (``max_tool_calls``, ``max_turns``, ``max_text_length``, ...).
    """

    TOOLS = ("python",)
    DATASETS = "procedural (default) | GSM8K/MATH500/AIME JSONL | reference RL parquet | hf:<name>"

    def __init__(
        self,
        dataset: str | Path | Sequence[Task] = "procedural",
        split: str = "train",
        reward: RewardSpec = "math_verify",
        sandbox: SandboxConfig | dict[str, Any] | str | None = None,
        num_tasks: int = 1000,
        difficulty: int | None = None,
        ability: str | None = "math",
        limit: int | None = None,
        system_prompt: str | None = None,
        max_tool_calls: int = 3,
        **kwargs: Any,
    ):
        def procedural(split_name: str) -> ProceduralMath:
            if split_name not in SPLIT_SEEDS:
                raise ValueError(f"procedural split must be one of {sorted(SPLIT_SEEDS)}, got {split_name!r}")
            return ProceduralMath(seed=SPLIT_SEEDS[split_name], num_tasks=num_tasks, difficulty=difficulty)

        file_options = {"ability": ability, "limit": limit} if str(dataset).endswith(".parquet") else {"limit": limit}
        tasks = resolve_tasks(dataset, split, procedural, **file_options)
        tools = [PythonTool(sandbox=sandbox)]
        tags = tuple(tool.name for tool in tools)
        super().__init__(
            tasks=tasks,
            tools=tools,
            reward=resolve_reward(reward, tags, MATH_REWARDS, "RAPO-Math-v0"),
            system_prompt=(SHORT_MATH_PROMPT if system_prompt == "short" else system_prompt)
            or build_system_prompt({tag: TOOL_DESCRIPTIONS[tag] for tag in tags}, max_tool_calls),
            max_tool_calls=max_tool_calls,
            **kwargs,
        )

