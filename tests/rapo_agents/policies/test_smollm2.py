"""One short check of HFPolicy on the embedded SmolLM2-135M-Instruct (dequantized once, then cached)."""

from __future__ import annotations

import pytest
import torch

from rapo_agents.policies import SamplingParams


@pytest.mark.slow
def test_smollm2_generates_with_exact_logprobs_padding_and_stop(smollm2, smollm2_chat):
    policy, tokenizer = smollm2, smollm2.tokenizer
    context = smollm2_chat("What is 2+3?")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4, stop=())
    short = tokenizer.encode("Hi", add_special_tokens=False)
    alone, with_padding = policy.generate([context], greedy)[0], policy.generate([short, context], greedy)[1]
    assert alone.token_ids == with_padding.token_ids and alone.num_tokens > 0

    ids = torch.tensor([context + alone.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(policy.model(ids).logits.float()[0], dim=-1)
    expected = logprobs[len(context) - 1 : -1].gather(-1, torch.tensor(alone.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(alone.logprobs), expected, atol=1e-3, rtol=1e-3)

    if alone.num_tokens >= 3:
        stop = tokenizer.decode(alone.token_ids[1:3])
        if stop.strip():
            cut = policy.generate([context], greedy.replace(stop=(stop,), max_new_tokens=3))[0]
            assert cut.finish_reason == "stop" and cut.text.endswith(stop)
            assert cut.token_ids == alone.token_ids[: cut.num_tokens]


def test_the_embedded_tokenizer_decodes_without_the_bpe_clean_up_warning(smollm2):
    # transformers skips the clean-up for BPE tokenizers anyway, and warns at every run if it is asked for.
    assert smollm2.tokenizer.clean_up_tokenization_spaces is False
    assert smollm2.tokenizer.decode(smollm2.tokenizer.encode("x , y .")) == "x , y ."
