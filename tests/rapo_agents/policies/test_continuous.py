"""The continuous batch of FastPolicy: rows that join at any token and leave when they finish decode as they would
alone (fp32 matches the reference HFPolicy), the running cache moves when it fills, the batch holds at most its
rows, and finished rows feed the prefix cache of the next turn."""

from __future__ import annotations

import copy

import pytest
import torch

from rapo_agents.policies import SamplingParams
from rapo_agents.policies import continuous as continuous_module
from rapo_agents.policies.fast import FastPolicy
from rapo_agents.policies.hf import HFPolicy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, stop=())


@pytest.fixture
def reference(tiny_policy):
    """A private copy of the tiny random Llama as an `HFPolicy`."""
    return HFPolicy(copy.deepcopy(tiny_policy.model), tiny_policy.tokenizer, max_batch_size=16)


def play(policy: FastPolicy, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]) -> dict:
    """Decode with a continuous batch, adding ``arrivals[step]`` before that step; the generations by key."""
    finished, step = {}, 0
    with policy.continuous_batch() as batch:
        while batch or any(at >= step for at in arrivals):
            for key, context, params in arrivals.get(step, []):
                batch.add(key, context, params)
            finished.update(batch.step())
            step += 1
    return finished


def test_rows_joining_at_any_step_decode_as_the_reference_does_alone(reference, monkeypatch):
    monkeypatch.setattr(continuous_module, "CACHE_CHUNK", 3)  # the running cache fills and moves many times
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32", max_batch_size=4)
    encode = reference.tokenizer.encode
    rows = {
        "short": (encode("hi"), GREEDY.replace(max_new_tokens=9)),
        "sampled": (encode("Compute 12 * 7 with python."), SamplingParams(temperature=1.0, max_new_tokens=14,
                                                                          stop=(), seed=3)),
        # joins later with a context longer than every column before the shared end: the cache makes room first
        "long": (encode("A much longer context that joins while the others are already decoding."), GREEDY),
        "one token": (encode("x"), GREEDY.replace(max_new_tokens=1)),
        "last": (encode("joins after rows left"), GREEDY.replace(max_new_tokens=5)),
    }
    arrivals = {0: [("short", *rows["short"]), ("sampled", *rows["sampled"])],
                2: [("long", *rows["long"]), ("one token", *rows["one token"])],
                11: [("last", *rows["last"])]}
    got = play(fast, arrivals)
    assert set(got) == set(rows)
    for key, (context, params) in rows.items():
        expected = reference.generate([context], params.replace(logprobs=True))[0]
        assert got[key].token_ids == expected.token_ids, key
        assert got[key].finish_reason == expected.finish_reason
        torch.testing.assert_close(torch.tensor(got[key].logprobs), torch.tensor(expected.logprobs),
                                   atol=1e-4, rtol=1e-4)


def test_a_full_batch_refuses_rows_and_a_row_without_budget_comes_back_at_once(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32", max_batch_size=2)
    context = reference.tokenizer.encode("abc")
    with fast.continuous_batch() as batch:
        batch.add("a", context, GREEDY)
        batch.add("b", context * fast.max_context, GREEDY)  # the model's whole context: nothing left to decode
        assert batch.free == 0 and len(batch) == 2
        with pytest.raises(RuntimeError, match="batch is full"):
            batch.add("c", context, GREEDY)
        first = dict(batch.step())
        assert first["b"].token_ids == [] and first["b"].finish_reason == "length"
        assert batch.free == 1  # "a" decodes on
        with pytest.raises(ValueError, match="empty"):
            batch.add("d", [], GREEDY)


def test_a_finished_row_is_reused_by_the_next_turns_prefill(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    context = reference.tokenizer.encode("Turn one of an episode.")
    first = play(fast, {0: [("turn 1", context, GREEDY)]})["turn 1"]
    following = context + first.token_ids + reference.tokenizer.encode(" The tool said 42.")
    reused = fast.prefill_stats.reused_tokens
    second = play(fast, {0: [("turn 2", following, GREEDY)]})["turn 2"]
    # everything but the last generated token (sampled, never fed) came from the store
    assert fast.prefill_stats.reused_tokens - reused == len(context) + len(first.token_ids) - 1
    assert second.token_ids == reference.generate([following], GREEDY)[0].token_ids


def test_the_batch_decodes_on_the_policys_threads_and_gives_the_callers_back(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32", threads=1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with fast.continuous_batch():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
