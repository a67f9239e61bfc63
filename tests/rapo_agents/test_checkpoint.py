"""Checkpoints: atomic, pruned, exact RNG round trip; signals become a clean stop."""

from __future__ import annotations

import os
import random
import signal

import numpy as np
import pytest
import torch

from rapo_agents.checkpoint import CheckpointError, CheckpointManager, GracefulInterrupt, rng_state, set_rng_state
from rapo_agents.sampler import QuestionSampler


def test_save_load_and_keep_last(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(step, {"trainer": {"step": step}, "weights": torch.full((2,), float(step))})
    assert [path.name for path in manager.checkpoints()] == ["step_000002", "step_000003"]
    state = manager.load_latest()
    assert state["trainer"]["step"] == 3 and state["weights"].tolist() == [3.0, 3.0]
    assert (manager.latest() / "trainer_state.json").is_file()


def test_incomplete_checkpoints_are_ignored_and_corrupt_ones_raise(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest() is None
    manager.save(1, {"trainer": {"step": 1}})
    # A crash mid-save leaves a temporary folder (and a step folder without state): never picked up.
    (tmp_path / ".tmp_step_000002_99").mkdir()
    (tmp_path / "step_000003").mkdir()
    assert manager.latest().name == "step_000001"
    (tmp_path / "step_000001" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        manager.load_latest()
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep_last=0)


def test_rng_state_round_trip():
    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_sampler_resume_is_exact_across_epochs():
    reference = QuestionSampler(num_tasks=7, batch_size=3, seed=4)
    batches = [reference.next_batch() for _ in range(5)]
    assert all(len(set(batch)) == 3 for batch in batches)
    assert reference.epoch == 2  # 2 batches per epoch, the 7th task dropped
    resumed = QuestionSampler(num_tasks=7, batch_size=3, seed=4)
    for _ in range(3):
        resumed.next_batch()
    state = resumed.state_dict()
    again = QuestionSampler(num_tasks=7, batch_size=3, seed=4)
    again.load_state_dict(state)
    assert [again.next_batch() for _ in range(2)] == batches[3:]
    with pytest.raises(ValueError):
        QuestionSampler(num_tasks=7, batch_size=3, seed=5).load_state_dict(state)


def test_graceful_interrupt_turns_the_first_signal_into_a_flag():
    with GracefulInterrupt() as interrupt:
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupt.requested and interrupt.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is not interrupt._handle
