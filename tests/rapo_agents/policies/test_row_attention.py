"""Attention for the int8 and fp32 decoders: softmax attention over a row's valid slots, whose bits depend on that
row's own tokens alone, not on the padding, the cache window, the other rows of the batch, the threads or the
prefill split."""

from __future__ import annotations

import platform

import pytest
import torch

from rapo_agents.policies import row_attention as module
from rapo_agents.policies.native import compiled_library
from rapo_agents.policies.row_attention import row_attention, row_attention_available

pytestmark = pytest.mark.skipif(not row_attention_available(64), reason="no C compiler ('cc') builds the kernel here")

HEADS, KV_HEADS, DIM = 6, 2, 64


def reference(q, keys, values, valid, start):
    """Float64 softmax attention, one query at a time, over the valid slots up to the query's own."""
    batch, heads, seq, dim = q.shape
    groups = heads // keys.shape[1]
    out = torch.zeros(batch, seq, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for s in range(seq):
            if not valid[b, start + s]:
                continue
            seen = valid[b, : start + s + 1]
            for h in range(heads):
                k, v = keys[b, h // groups, : start + s + 1][seen], values[b, h // groups, : start + s + 1][seen]
                weights = torch.softmax(k.double() @ q[b, h, s].double() / dim**0.5, dim=0)
                out[b, s, h] = weights @ v.double()
    return out.reshape(batch, seq, heads * dim)


def random_cache(batch: int, capacity: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, KV_HEADS, capacity, DIM, generator=generator)
    return keys, torch.randn(batch, KV_HEADS, capacity, DIM, generator=generator), generator


def test_it_is_softmax_attention_over_the_valid_slots_up_to_each_query():
    keys, values, generator = random_cache(3, 48, seed=0)
    valid = torch.zeros(3, 48, dtype=torch.bool)
    valid[0, :40] = True
    valid[1, 7:40] = True  # left padding
    valid[2, :40] = True
    valid[2, 12:15] = False  # a gap mid-row (what placing a row into a running cache leaves)
    q = 3 * torch.randn(3, HEADS, 8, DIM, generator=generator)  # a prefill of 8 tokens at slots 32..39
    out = row_attention(q, keys, values, valid, start=32)
    assert out.shape == (3, 8, HEADS * DIM)
    assert torch.allclose(out.double(), reference(q, keys, values, valid, 32), atol=2e-6)


def test_a_query_at_a_padding_slot_gets_zeros_and_no_nan():
    keys, values, generator = random_cache(1, 16, seed=1)
    valid = torch.ones(1, 16, dtype=torch.bool)
    valid[0, :10] = False
    out = row_attention(torch.randn(1, HEADS, 4, DIM, generator=generator), keys, values, valid, start=8)
    assert not out[0, :2].any() and out[0, 2:].abs().sum() > 0 and not out.isnan().any()


def test_a_rows_bits_do_not_depend_on_its_place_padding_window_batch_or_threads():
    keys, values, generator = random_cache(1, 30, seed=2)
    q = torch.randn(1, HEADS, 1, DIM, generator=generator)
    alone = row_attention(q, keys, values, torch.ones(1, 30, dtype=torch.bool), start=29)
    # The same 30 tokens 50 slots further in a window of 128, after left padding, beside two other rows.
    capacity, shift = 128, 50
    big_keys, big_values, _ = random_cache(3, capacity, seed=3)
    big_keys[1, :, shift:shift + 30], big_values[1, :, shift:shift + 30] = keys[0], values[0]
    valid = torch.zeros(3, capacity, dtype=torch.bool)
    valid[:, shift:shift + 30] = True
    valid[0, :shift + 30], valid[2, 10:shift + 30] = True, True
    queries = torch.randn(3, HEADS, 1, DIM, generator=generator)
    queries[1] = q[0]
    for threads in (1, 2):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            together = row_attention(queries, big_keys, big_values, valid, start=shift + 29)
        finally:
            torch.set_num_threads(previous)
        assert torch.equal(together[1], alone[0])


def test_a_prefill_gives_each_token_the_bits_of_decoding_it_step_by_step():
    keys, values, generator = random_cache(2, 24, seed=4)
    valid = torch.ones(2, 24, dtype=torch.bool)
    valid[1, :5] = False
    q = torch.randn(2, HEADS, 6, DIM, generator=generator)
    prefill = row_attention(q, keys, values, valid, start=18)
    steps = torch.cat([row_attention(q[:, :, s:s + 1], keys, values, valid, start=18 + s) for s in range(6)], dim=1)
    assert torch.equal(prefill, steps)


def test_heads_that_do_not_group_or_slots_past_the_cache_are_refused():
    keys, values, _ = random_cache(1, 8, seed=5)
    valid = torch.ones(1, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="group evenly"):
        row_attention(torch.randn(1, 5, 1, DIM), keys, values, valid, start=7)
    with pytest.raises(ValueError, match="fit the cache"):
        row_attention(torch.randn(1, HEADS, 2, DIM), keys, values, valid, start=7)


def test_a_window_of_a_larger_cache_gives_the_bits_of_its_copy():
    # A decode step of a running batch reads its live rows' window of the cache in place (a strided view).
    keys, values, generator = random_cache(5, 64, seed=8)
    valid = torch.rand(5, 64, generator=generator) > 0.3
    valid[:, 50] = True
    window = (slice(1, 4), slice(None), slice(20, 51))
    q = torch.randn(3, HEADS, 1, DIM, generator=generator)
    in_place = row_attention(q, keys[window], values[window], valid[1:4, 20:51], start=30)
    copied = row_attention(q, keys[window].contiguous(), values[window].contiguous(),
                           valid[1:4, 20:51].contiguous(), start=30)
    assert torch.equal(in_place, copied)
    assert torch.allclose(in_place.double(), reference(q, keys[window], values[window], valid[1:4, 20:51], 30),
                          atol=2e-6)


def tiny_config(head_dim: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=4 * head_dim, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2)


def test_the_decoder_takes_it_for_float32_caches_and_only_for_heads_of_whole_lanes():
    from rapo_agents.policies.llama_decoder import LlamaDecoder

    cpu = torch.device("cpu")
    assert LlamaDecoder(tiny_config(16), "int8", cpu).row_attention
    assert LlamaDecoder(tiny_config(16), "fp32", cpu).row_attention
    assert not LlamaDecoder(tiny_config(16), "bf16", cpu).row_attention  # the kernel reads float32
    assert not LlamaDecoder(tiny_config(8), "int8", cpu).row_attention


def test_without_the_kernel_it_answers_none_and_the_decoder_keeps_torchs_attention(monkeypatch):
    from rapo_agents.policies.llama_decoder import LlamaDecoder

    monkeypatch.setenv("RAPO_NATIVE", "0")
    module._library.cache_clear()
    try:
        assert not row_attention_available(DIM)
        keys, values, _ = random_cache(1, 8, seed=6)
        assert row_attention(torch.randn(1, HEADS, 1, DIM), keys, values, torch.ones(1, 8, dtype=torch.bool), 7) is None
        assert not LlamaDecoder(tiny_config(16), "int8", torch.device("cpu")).row_attention
    finally:
        module._library.cache_clear()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="compares x86-64 builds of other vector widths")
def test_builds_for_other_vector_widths_give_the_same_bits(monkeypatch):
    # The kernel is built for the CPU it runs on (-march=native): AVX-512 here, AVX2 or SSE2 elsewhere. Its sums
    # run in 16 fixed lanes and its exponential in plain float32 operations, so every build gives the same bits.
    keys, values, generator = random_cache(3, 96, seed=7)
    valid = torch.ones(3, 96, dtype=torch.bool)
    valid[1, :20], valid[2, 40:45] = False, False
    q = 4 * torch.randn(3, HEADS, 9, DIM, generator=generator)
    native = row_attention(q, keys, values, valid, start=80)
    for march in ("x86-64-v3", "x86-64"):  # AVX2 with FMA; SSE2
        library = compiled_library(f"row_attention_{march}", module._SOURCE,
                                   ("-O3", f"-march={march}", "-fopenmp", "-ffp-contract=off"), module._SIGNATURES)
        assert library is not None
        monkeypatch.setattr(module, "_library", lambda library=library: library)
        assert torch.equal(row_attention(q, keys, values, valid, start=80), native), march
