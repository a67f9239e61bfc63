"""Checkpoints: atomic, pruned, exact RNG round trip; signals become a clean stop."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rapo_agents.checkpoint import (
    STATE_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    CheckpointManager,
    load_weights,
    rng_state,
    set_rng_state,
)
from rapo_agents.sampler import QuestionSampler


def test_save_load_and_keep_last(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(step, {"trainer": {"step": step}, "weights": torch.full((2,), float(step))})
    assert [path.name for path in manager.checkpoints()] == ["step_000002", "step_000003"]
    folder, state = manager.load_latest()
    assert folder.name == "step_000003" and state["trainer"]["step"] == 3 and state["weights"].tolist() == [3.0, 3.0]
    assert (manager.latest() / "trainer_state.json").is_file()


def test_incomplete_checkpoints_are_ignored_and_a_corrupt_newest_one_falls_back(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest() is None
    manager.save(1, {"trainer": {"step": 1}})
    manager.save(2, {"trainer": {"step": 2}})
    # A crash mid-save leaves a temporary folder (and a step folder without state): never picked up.
    (tmp_path / ".tmp_step_000003_99").mkdir()
    (tmp_path / "step_000004").mkdir()
    assert manager.latest().name == "step_000002"
    (tmp_path / "step_000002" / STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        manager.load(tmp_path / "step_000002")
    with pytest.warns(UserWarning, match="skipping checkpoint step_000002"):
        folder, state = manager.load_latest()
    assert folder.name == "step_000001" and state["trainer"]["step"] == 1
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep_last=0)


class _Payload:
    """What a malicious pickle would run on load: here it only leaves a file behind."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_holding_arbitrary_pickle_is_refused_without_running_it(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints")
    folder = manager.save(1, {"trainer": {"step": 1}})
    marker = tmp_path / "pwned"
    torch.save({"trainer": {"step": 1}, "payload": _Payload(str(marker))}, folder / STATE_FILE)
    with pytest.raises(CheckpointError, match="refused"):
        manager.load(folder)
    assert not marker.exists()


def test_checkpoints_hold_the_policy_in_hugging_face_format(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"trainer": {"step": 1}}, model)
    folder = manager.save(2, {"trainer": {"step": 2}}, model)
    assert [path.name for path in manager.checkpoints()] == ["step_000002"]  # keep_last covers the weights too
    assert {"config.json", WEIGHTS_FILE, STATE_FILE, "trainer_state.json"} <= {p.name for p in folder.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    fresh = LlamaForCausalLM(model.config)
    load_weights(fresh, folder)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()  # still tied


def test_resaving_a_step_never_leaves_it_missing(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"trainer": {"step": 1, "version": "a"}})
    manager.save(1, {"trainer": {"step": 1, "version": "b"}})
    assert manager.load_latest()[1]["trainer"]["version"] == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_a_save_that_fails_midway_leaves_the_last_checkpoint_and_no_half_written_copy(tmp_path):
    import errno

    class FullDisk(torch.nn.Module):  # a model whose weights cannot be written, as on a full disk
        def save_pretrained(self, folder, **kwargs):
            (folder / "model.safetensors").write_bytes(b"x" * 1024)
            raise OSError(errno.ENOSPC, "No space left on device")

    manager = CheckpointManager(tmp_path)
    manager.save(1, {"trainer": {"step": 1}})
    with pytest.raises(OSError, match="No space left"):
        manager.save(2, {"trainer": {"step": 2}}, model=FullDisk())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]
    assert manager.load_latest()[1]["trainer"]["step"] == 1


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


# Malformed pickles (the red team's): each makes torch's weights-only unpickler raise something other than an
# UnpicklingError (IndexError, KeyError, TypeError, UnicodeDecodeError, EOFError); one holds no dict at all.
MALFORMED_STATES = {
    "reduce-without-a-callable": b"\x80\x02)R.",
    "stack-underflow": b"\x80\x02t.",
    "memo-miss": b"\x80\x02h\x05.",
    "unhashable-key": b"\x80\x02}]K\x01s.",
    "bad-utf8": b"\x80\x02X\x02\x00\x00\x00\xff\xfe.",
    "truncated-string": b"\x80\x02X\xff\xff\xff\x7f",
    "not-a-dict": b"\x80\x02K\x07.",
}


@pytest.mark.parametrize("data", MALFORMED_STATES.values(), ids=MALFORMED_STATES.keys())
def test_a_malformed_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, data):
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"trainer": {"step": 1}})
    newest = manager.save(2, {"trainer": {"step": 2}})
    (newest / STATE_FILE).write_bytes(data)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        manager.load(newest)
    with pytest.warns(UserWarning, match="skipping checkpoint step_000002"):
        folder, state = manager.load_latest()
    assert folder.name == "step_000001" and state["trainer"]["step"] == 1


def test_a_save_never_deletes_itself_to_keep_a_newer_unreadable_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"trainer": {"step": 1}})
    (tmp_path / "step_000005").mkdir()  # a newer checkpoint whose state is unreadable (a crash, a bad disk)
    (tmp_path / "step_000005" / STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="skipping checkpoint step_000005"):
        assert manager.load_latest()[0].name == "step_000001"  # the run resumes from step 1 ...
    for step in (2, 3):  # ... and saves its next steps: each one stays, the older ones go
        saved = manager.save(step, {"trainer": {"step": step}})
        assert saved.is_dir()
        assert [path.name for path in manager.checkpoints()] == [saved.name, "step_000005"]


def test_a_weights_file_with_a_bad_header_is_a_checkpoint_error(tmp_path):
    model = torch.nn.Linear(2, 2)
    for name, data in {"header-too-long": (1 << 40).to_bytes(8, "little") + b"{}",
                       "header-not-json": (5).to_bytes(8, "little") + b"{oops"}.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / WEIGHTS_FILE).write_bytes(data)
        with pytest.raises(CheckpointError, match="cannot read the weights"):
            load_weights(model, folder)
