"""Which questions each training step uses: seeded epochs over the task list, with an exact resume position.

Example:
    >>> sampler = QuestionSampler(num_tasks=5, batch_size=2, seed=0)
    >>> first = sampler.next_batch()
    >>> state = sampler.state_dict()
    >>> second = sampler.next_batch()
    >>> resumed = QuestionSampler(num_tasks=5, batch_size=2, seed=0)
    >>> resumed.load_state_dict(state)
    >>> resumed.next_batch() == second
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np


class QuestionSampler:
    """Batches of task indices: each epoch is a seeded permutation (or the plain order), the last partial batch dropped.

    Args:
        num_tasks: size of the task list.
        batch_size: questions per training step.
        seed: the permutation of epoch ``e`` depends only on ``(seed, e)``.
        shuffle: permute every epoch (else the file order).
    """

    def __init__(self, num_tasks: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_tasks < batch_size:
            raise ValueError(f"need at least batch_size={batch_size} tasks, got {num_tasks}")
        self.num_tasks = num_tasks
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.num_tasks // self.batch_size

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_tasks)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)

    def next_batch(self) -> list[int]:
        """The next batch's task indices (advancing to a new epoch when the current one is used up)."""
        if self.position + self.batch_size > self.num_tasks:
            self.epoch += 1
            self.position = 0
        order = self._order(self.epoch)
        batch = order[self.position : self.position + self.batch_size].tolist()
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The resume position (epoch and offset), plus the settings it is valid for."""
        return {"epoch": self.epoch, "position": self.position, "num_tasks": self.num_tasks,
                "batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position.

        Raises:
            ValueError: when the state comes from a sampler with other settings.
        """
        for name in ("num_tasks", "batch_size", "seed", "shuffle"):
            if state.get(name) != getattr(self, name):
                raise ValueError(f"sampler state has {name}={state.get(name)!r}, this sampler {getattr(self, name)!r}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
