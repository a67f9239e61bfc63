"""FastPolicy's prefix caching: multi-turn results equal those of whole-context prefills (fp32; int8 within its
tolerance), a turn prefills only its new tokens, a batch's shared prefix runs once, and the store stays within its
budget and forgets everything when the weights change. `PrefixCache` and `shared_prefixes` on their own too."""

from __future__ import annotations

import copy

import pytest
import torch

from rapo_agents.policies import SamplingParams
from rapo_agents.policies.fast import FastPolicy
from rapo_agents.policies.hf import HFPolicy
from rapo_agents.policies.prefix_cache import PrefixCache, shared_prefixes

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, stop=())
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, stop=(), seed=3)
SYSTEM = "System: solve the task, call python when it helps, and give the final answer.\n"
"""A system prompt longer than `MIN_SHARED_TOKENS` byte tokens, shared by the rows of a batch."""
TOOL_RESULTS = ["\n<result>\n84\n</result>\n", "\n<result>\nNameError: x\n</result>\nHint: define x first.\n"]
"""What the env appends after each turn."""
INT8_MEAN_TOLERANCE = 0.01
"""Mean |log-prob diff| per token allowed for int8 decoding of the tiny random model (measured 0.0009)."""
SMOLLM2_INT8_MEAN_TOLERANCE = 0.12
"""The same for the embedded SmolLM2's second turn (measured 0.069; about 0.15 before each row's rounding residual
joined the matmuls)."""


@pytest.fixture(scope="module")
def reference(tiny_policy):
    """A private copy of the tiny random Llama as the reference `HFPolicy` (whole-context prefills)."""
    return HFPolicy(copy.deepcopy(tiny_policy.model), tiny_policy.tokenizer, max_batch_size=16)


def prompts(policy, *questions):
    return [policy.tokenizer.encode(SYSTEM + question) for question in questions]


def play(policy, contexts, params, turns=3):
    """Multi-turn episodes: each turn continues the last context with its generation and a tool result."""
    contexts, history = [list(c) for c in contexts], []
    for turn in range(turns):
        generations = policy.generate(contexts, params)
        history.append(generations)
        appended = policy.tokenizer.encode(TOOL_RESULTS[turn % len(TOOL_RESULTS)])
        contexts = [c + g.token_ids + appended for c, g in zip(contexts, generations, strict=True)]
    return history, contexts


def assert_same(got, expected):
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.token_ids == theirs.token_ids and mine.finish_reason == theirs.finish_reason
        for field in ("logprobs", "entropies"):
            torch.testing.assert_close(torch.tensor(getattr(mine, field)), torch.tensor(getattr(theirs, field)),
                                       atol=1e-4, rtol=1e-4)


def logprob_errors(model, context, generation):
    """|difference| between ``generation``'s log-probs and ``model``'s own for its tokens after ``context``."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([context + generation.token_ids])).logits.float()[0], -1)
    chosen = logprobs[len(context) - 1 : -1].gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
    return (torch.tensor(generation.logprobs) - chosen).abs()


def prefill_delta(policy, contexts, params):
    """(generations, prompt tokens prefilled, reused) of one `generate` call."""
    before = (policy.prefill_stats.prefilled_tokens, policy.prefill_stats.reused_tokens)
    generations = policy.generate(contexts, params)
    return (generations, policy.prefill_stats.prefilled_tokens - before[0],
            policy.prefill_stats.reused_tokens - before[1])


# ---- exactness ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_fp32_multi_turn_results_equal_whole_context_prefills(reference, sampling):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    contexts = prompts(reference, "Compute 12 * 7.", "What is 2 + 3?", "Name the capital of France, briefly.")
    params = [sampling.replace(seed=seed) for seed in range(len(contexts))]
    cached, _ = play(fast, contexts, params)
    expected, _ = play(reference, contexts, params)
    for got, want in zip(cached, expected, strict=True):
        assert_same(got, want)
    stats = fast.prefill_stats
    assert stats.reused_tokens > stats.prompt_tokens / 2  # the cache did serve these turns
    assert stats.prefilled_tokens < stats.prompt_tokens


def test_int8_multi_turn_log_probs_stay_within_int8_tolerance_of_the_reference(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="int8")
    contexts = prompts(reference, "Compute 12 * 7.", "short")
    params = [SAMPLED.replace(seed=seed) for seed in range(len(contexts))]
    history, last = play(fast, contexts, params, turns=2)
    assert fast.prefill_stats.reused_tokens > 0
    appended = len(reference.tokenizer.encode(TOOL_RESULTS[1]))
    errors = [logprob_errors(reference.model, final[: len(final) - appended - second.num_tokens], second)
              for final, second in zip(last, history[-1], strict=True)]
    assert float(torch.cat(errors).mean()) < INT8_MEAN_TOLERANCE


# ---- what is reused --------------------------------------------------------------------------------------


def test_a_second_turn_prefills_only_the_last_generated_token_and_the_appended_tokens(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    [context] = prompts(reference, "Compute 12 * 7.")
    [first], prefilled, reused = prefill_delta(fast, [context], GREEDY)
    assert (prefilled, reused) == (len(context), 0)
    appended = reference.tokenizer.encode(TOOL_RESULTS[0])
    second_context = context + first.token_ids + appended
    [second], prefilled, reused = prefill_delta(fast, [second_context], GREEDY)
    # The last generated token was sampled, never fed, so its KV is not stored.
    assert (prefilled, reused) == (len(appended) + 1, len(context) + first.num_tokens - 1)
    assert_same([second], reference.generate([second_context], GREEDY))


def test_the_prefix_shared_by_a_batch_is_prefilled_once(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    questions = ("Compute 12 * 7.", "What is 2 + 3?", "Name a prime.", "Sum 1 to 10.")
    contexts = prompts(reference, *questions)
    shared = len(reference.tokenizer.encode(SYSTEM))
    generations, prefilled, reused = prefill_delta(fast, contexts, GREEDY)
    assert reused == shared * len(contexts)
    assert prefilled == shared + sum(len(c) - shared for c in contexts)
    assert_same(generations, reference.generate(contexts, GREEDY))


def test_the_same_context_twice_in_one_batch_is_prefilled_once(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    [context] = prompts(reference, "Compute 12 * 7.")
    params = [SAMPLED.replace(seed=1), SAMPLED.replace(seed=2)]
    generations, prefilled, reused = prefill_delta(fast, [context, context], params)
    assert (prefilled, reused) == (len(context) + 2, 2 * (len(context) - 1))  # each row runs its last token
    assert_same(generations, reference.generate([context, context], params))


def test_a_batch_mixing_stored_and_new_rows_of_different_lengths_matches_the_reference(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    _, [continued] = play(fast, prompts(reference, "Compute 12 * 7."), GREEDY, turns=1)
    fresh_long = reference.tokenizer.encode("An unrelated and much longer context " * 4)
    fresh_short = reference.tokenizer.encode("hi")
    batch = [fresh_short, continued, fresh_long]  # stored prefix + few new tokens beside long and short new rows
    generations, _, reused = prefill_delta(fast, batch, GREEDY)
    assert reused == len(continued) - len(reference.tokenizer.encode(TOOL_RESULTS[0])) - 1
    assert_same(generations, reference.generate(batch, GREEDY))


def test_a_context_shorter_than_a_stored_sequence_reuses_all_but_its_last_token(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32")
    [context] = prompts(reference, "Compute 12 * 7.")
    [first] = fast.generate([context], GREEDY)
    inside = context + first.token_ids[:3]  # ends inside the stored sequence
    diverging = context[:-4] + reference.tokenizer.encode(" other")  # leaves it early
    for shorter, expected_reuse in ((inside, len(inside) - 1), (context[:20], 19), (diverging, len(context) - 4)):
        [got], prefilled, reused = prefill_delta(fast, [shorter], GREEDY)
        assert (prefilled, reused) == (len(shorter) - expected_reuse, expected_reuse)
        assert_same([got], reference.generate([shorter], GREEDY))


# ---- the store's bounds --------------------------------------------------------------------------------


def test_the_store_evicts_least_recently_used_sequences_to_stay_within_its_budget(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32", prefix_cache_bytes=0)
    contexts = [reference.tokenizer.encode(f"{name}: " + "x" * 40) for name in ("first", "second", "third")]
    per_token = 2 * fast.decoder.new_cache(1, 1).keys.nbytes  # keys and values of one token
    budget = per_token * (len(contexts[0]) + GREEDY.max_new_tokens) * 2  # about two sequences
    fast.prefix_cache = PrefixCache(budget)
    for context in contexts:
        fast.generate([context], GREEDY)
        assert fast.prefix_cache.nbytes <= budget
    assert len(fast.prefix_cache) == 2
    _, prefilled, _ = prefill_delta(fast, [contexts[2]], GREEDY)  # kept
    assert prefilled == 1
    _, prefilled, _ = prefill_delta(fast, [contexts[0]], GREEDY)  # the least recently used: evicted
    assert prefilled == len(contexts[0])


def test_a_weight_update_empties_the_store_so_old_keys_and_values_are_never_reused(reference):
    model = copy.deepcopy(reference.model)
    fast = FastPolicy(model, reference.tokenizer, weight_format="fp32")
    [context] = prompts(reference, "Compute 12 * 7.")
    fast.generate([context], GREEDY)
    with torch.no_grad():  # an in-place optimizer step on the shared module, no sync called
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    [after], prefilled, reused = prefill_delta(fast, [context], GREEDY)
    assert (prefilled, reused) == (len(context), 0)
    assert_same([after], HFPolicy(model, reference.tokenizer).generate([context], GREEDY))

    trainer = copy.deepcopy(model)
    with torch.no_grad():
        trainer.model.layers[1].self_attn.v_proj.weight.mul_(0.5)
    fast.sync_weights(trainer)  # a separate trainer's weights, copied in
    assert len(fast.prefix_cache) == 0
    assert_same(fast.generate([context], GREEDY), HFPolicy(trainer, reference.tokenizer).generate([context], GREEDY))


def test_without_a_budget_every_context_is_prefilled_whole(reference):
    fast = FastPolicy(reference.model, reference.tokenizer, weight_format="fp32", prefix_cache_bytes=0)
    history, _ = play(fast, prompts(reference, "Compute 12 * 7.", "What is 2 + 3?"), GREEDY, turns=2)
    stats = fast.prefill_stats
    assert stats.reused_tokens == 0 and stats.prefilled_tokens == stats.prompt_tokens > 0
    assert len(fast.prefix_cache) == 0
    with pytest.raises(ValueError, match="prefix_cache_bytes must be >= 0"):
        FastPolicy(reference.model, reference.tokenizer, prefix_cache_bytes=-1)


# ---- PrefixCache and shared_prefixes on their own -----------------------------------------------------------


def kv(tokens: int) -> torch.Tensor:
    return torch.arange(tokens, dtype=torch.float32).view(1, 1, tokens, 1).expand(2, 1, tokens, 3).contiguous()


def test_lookup_returns_the_longest_stored_prefix_within_its_limit():
    store = PrefixCache(max_bytes=1 << 20)
    store.insert([1, 2, 3], kv(3), kv(3))
    store.insert([1, 2, 4, 5, 6], kv(5), kv(5))
    match = store.lookup([1, 2, 4, 5, 9])
    assert match.length == 4 and torch.equal(match.keys, kv(5)[:, :, :4])
    assert store.lookup([1, 2, 4, 5, 9], limit=2).length == 2
    assert store.lookup([8]) is None


def test_an_entry_extended_by_a_newer_one_is_dropped_and_a_covered_one_is_not_stored():
    store = PrefixCache(max_bytes=1 << 20)
    store.insert([1, 2], kv(2), kv(2))
    store.insert([1, 2, 3], kv(3), kv(3))
    assert len(store) == 1 and store.nbytes == 2 * kv(3).nbytes
    store.insert([1, 2], kv(2), kv(2))
    assert len(store) == 1 and store.lookup([1, 2, 3]).length == 3


def test_the_least_recently_used_entry_leaves_first_and_oversized_ones_never_enter():
    store = PrefixCache(max_bytes=2 * 2 * kv(4).nbytes)  # two entries of 4 tokens
    store.insert([1, 1, 1, 1], kv(4), kv(4))
    store.insert([2, 2, 2, 2], kv(4), kv(4))
    store.lookup([1, 1])  # now the most recently used
    store.insert([3, 3, 3, 3], kv(4), kv(4))
    assert store.lookup([2]) is None and store.lookup([1]).length == 1 and store.lookup([3]).length == 1
    store.insert(list(range(10, 30)), kv(20), kv(20))
    assert store.lookup([10]) is None and len(store) == 2
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_the_store_refuses_a_negative_budget_and_keys_of_another_length():
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="must hold 3 tokens"):
        PrefixCache(1 << 20).insert([1, 2, 3], kv(2), kv(2))


def test_shared_prefixes_finds_each_group_prompt_and_the_prompt_all_groups_share():
    system, first, second = [7] * 5, [1, 2, 3], [4, 5]
    batch = [system + first, system + second + [6], system + first, system + second + [9], [8] * 9]
    assert sorted(shared_prefixes(batch, min_length=3)) == sorted([system + first, system + second])
    assert shared_prefixes([system + first, system + second], min_length=3) == [system]
    assert shared_prefixes([system + first, system + second], min_length=6) == []


# ---- the embedded SmolLM2 --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_int8_second_turn_with_the_cache_stays_within_int8_tolerance(smollm2, smollm2_chat):
    fast = FastPolicy(smollm2.model, smollm2.tokenizer, weight_format="int8")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop=())
    [first] = fast.generate([smollm2_chat("What is 12 * 7? Use python.")], greedy)
    context = smollm2_chat("What is 12 * 7? Use python.") + first.token_ids
    context += smollm2.tokenizer.encode("\n<result>\n84\n</result>\n", add_special_tokens=False)
    params = [SAMPLED.replace(seed=s, max_new_tokens=16) for s in range(2)]
    generations, _, reused = prefill_delta(fast, [context] * 2, params)
    assert reused == 2 * (len(context) - 1)
    errors = torch.cat([logprob_errors(smollm2.model, context, generation) for generation in generations])
    assert float(errors.mean()) < SMOLLM2_INT8_MEAN_TOLERANCE
