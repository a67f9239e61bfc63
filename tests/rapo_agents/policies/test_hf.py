"""HFPolicy on a tiny random Llama: log-probs, entropies, stop strings, padding, seeds, weight sync."""

from __future__ import annotations

import copy

import pytest
import torch

from rapo_agents.policies import HFPolicy, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16, stop=())


def encode(policy, text):
    return policy.tokenizer.encode(text)


def forward_logprobs(model, context, continuation):
    """Log-probs, entropies and top-10 of ``continuation`` from one plain forward pass."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits.float()[0], dim=-1)
    positions = logprobs[len(context) - 1 : -1]
    chosen = positions.gather(-1, torch.tensor(continuation)[:, None]).squeeze(-1)
    entropies = -(positions.exp() * positions).sum(-1)
    return chosen, entropies, positions.topk(10, dim=-1).values


def test_logprobs_entropies_and_top_k_match_a_separate_forward_pass(tiny_policy):
    context = encode(tiny_policy, "Compute 12 * 7 with python.")
    params = SamplingParams(temperature=1.0, max_new_tokens=20, stop=(), seed=3)
    [generation] = tiny_policy.generate([context], params)
    assert generation.num_tokens == 20 and generation.finish_reason == "length"
    chosen, entropies, top = forward_logprobs(tiny_policy.model, context, generation.token_ids)
    torch.testing.assert_close(torch.tensor(generation.logprobs), chosen, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(generation.entropies), entropies, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(generation.top_logprobs), top, atol=1e-4, rtol=1e-4)
    for ids, values in zip(generation.top_token_ids, generation.top_logprobs, strict=True):
        assert len(ids) == 10 and values == sorted(values, reverse=True)


def test_left_padding_does_not_change_results(tiny_policy):
    long_context = encode(tiny_policy, "A much longer context that forces the short one to be left padded.")
    short_context = encode(tiny_policy, "short")
    alone = [tiny_policy.generate([c], GREEDY)[0] for c in (long_context, short_context)]
    together = tiny_policy.generate([long_context, short_context], GREEDY)
    for single, batched in zip(alone, together, strict=True):
        assert single.token_ids == batched.token_ids
        torch.testing.assert_close(torch.tensor(single.logprobs), torch.tensor(batched.logprobs), atol=1e-4, rtol=1e-4)


def test_stop_string_cuts_at_its_first_occurrence(tiny_policy):
    context = encode(tiny_policy, "<python>")
    free = tiny_policy.generate([context], GREEDY)[0]
    text = tiny_policy.tokenizer.decode(free.token_ids)
    stop = text[6:8]  # some string the model does produce, used as if it were a closing tag
    cut = tiny_policy.generate([context], GREEDY.replace(stop=("</never>", stop)))[0]
    assert cut.finish_reason == "stop" and cut.stop_string == stop
    assert cut.text.endswith(stop) and cut.text.count(stop) == 1
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    assert len(cut.token_ids) < len(free.token_ids)


def test_seeded_sampling_is_reproducible_in_any_batch(tiny_policy):
    context = encode(tiny_policy, "seeded")
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=16, stop=(), seed=11)
    alone = tiny_policy.generate([context], params)[0]
    in_batch = tiny_policy.generate([encode(tiny_policy, "other context"), context],
                                    [params.replace(seed=5), params])[1]
    assert alone.token_ids == in_batch.token_ids
    other_seed = tiny_policy.generate([context], params.replace(seed=12))[0]
    assert other_seed.token_ids != alone.token_ids


def test_top_k_one_is_greedy_and_max_new_tokens_is_honoured(tiny_policy):
    context = encode(tiny_policy, "top-k")
    greedy = tiny_policy.generate([context], GREEDY)[0]
    sampled = tiny_policy.generate([context], SamplingParams(temperature=1.0, top_k=1, max_new_tokens=16, stop=(),
                                                             seed=1))[0]
    assert sampled.token_ids == greedy.token_ids
    short = tiny_policy.generate([context], GREEDY.replace(max_new_tokens=3))[0]
    assert short.token_ids == greedy.token_ids[:3] and short.finish_reason == "length"


def test_bad_input_gets_clear_errors(tiny_policy):
    with pytest.raises(ValueError, match="empty"):
        tiny_policy.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="2 SamplingParams for 1"):
        tiny_policy.generate([[5]], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_weight_sync_shared_module_is_free_and_copies_match(tiny_policy):
    assert tiny_policy.sync_weights(tiny_policy.model) is False
    trainer_model = copy.deepcopy(tiny_policy.model)
    with torch.no_grad():
        for parameter in trainer_model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    rollout = HFPolicy(copy.deepcopy(tiny_policy.model), tiny_policy.tokenizer)
    context = encode(rollout, "sync")
    before = rollout.generate([context], GREEDY)[0]
    assert rollout.sync_weights(trainer_model) is True
    after = rollout.generate([context], GREEDY)[0]
    reference = HFPolicy(trainer_model, tiny_policy.tokenizer).generate([context], GREEDY)[0]
    assert after.token_ids == reference.token_ids
    assert after.logprobs != before.logprobs


def test_generation_restores_the_training_flag(tiny_policy):
    tiny_policy.model.train()
    try:
        tiny_policy.generate([[10, 11]], GREEDY.replace(max_new_tokens=2))
        assert tiny_policy.model.training
    finally:
        tiny_policy.model.eval()
