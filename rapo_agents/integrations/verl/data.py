"""verl dataset rows for rapo envs: one row per task, played by `RapoEnvAgentLoop`.

verl's ``RLHFDataset`` needs a chat ``prompt`` column; the agent loop itself ignores it and
rebuilds the episode from the env (``extra_info.task_index``, with ``extra_info.env_kwargs``
merged over the loop's own, so a validation file can name its split).

Example:
    >>> rows = verl_rows("RAPO-Math-v0", {"num_tasks": 3, "sandbox": "subprocess"})
    >>> rows[0]["agent_name"], rows[0]["extra_info"]["task_index"], rows[0]["prompt"][1]["role"]
    ('rapo_env_agent', 0, 'user')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

import rapo_env  # noqa: F401  (registers the rapo env ids)
from rapo_agents.integrations.verl.agent_loop import AGENT_NAME


def verl_rows(env_id: str, env_kwargs: dict[str, Any] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """One verl row per task of ``gym.make(env_id, **env_kwargs)``."""
    env_kwargs = dict(env_kwargs or {})
    env = gym.make(env_id, **env_kwargs)
    try:
        tasks = env.unwrapped.tasks
        rows = []
        for index in range(len(tasks) if limit is None else min(limit, len(tasks))):
            prompt, info = env.reset(options={"task_index": index})
            task = tasks[index]
            rows.append({
                "data_source": f"rapo/{env_id}/{task.source}",
                "prompt": [
                    {"role": "system", "content": info["system_prompt"]},
                    {"role": "user", "content": prompt},
                ],
                "agent_name": AGENT_NAME,
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": list(task.answers)},
                "extra_info": {"task_index": index, "task_id": task.id, "env_kwargs": env_kwargs},
            })
        return rows
    finally:
        env.close()


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as a parquet file (parent folders created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
