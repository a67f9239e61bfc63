"""VLLMPolicy on a GPU: generation with stop strings and log-probs, weight update, sleep and wake."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
    reason="needs CUDA and vllm (the [gpu] extra)",
)


@needs_gpu
def test_vllm_policy_generates_updates_weights_and_sleeps():
    from transformers import AutoModelForCausalLM

    from rapo_agents.policies import SamplingParams
    from rapo_agents.policies.hf import HFPolicy, default_policy_path
    from rapo_agents.policies.vllm import VLLMPolicy

    path = default_policy_path()
    policy = VLLMPolicy.from_pretrained(path, gpu_memory_utilization=0.3, max_model_len=2048)
    context = policy.tokenizer.encode("The capital of France is", add_special_tokens=False)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, stop=())
    [first] = policy.generate([context], greedy)
    assert first.num_tokens > 0 and len(first.logprobs) == first.num_tokens
    assert len(first.top_logprobs[0]) == 10 and first.entropy_kind == "top_k"
    reference = HFPolicy.from_pretrained(path, device="cuda", dtype="float32").generate([context], greedy)[0]
    torch.testing.assert_close(torch.tensor(first.logprobs[:3]), torch.tensor(reference.logprobs[:3]),
                               atol=0.1, rtol=0.1)
    stop = policy.tokenizer.decode(first.token_ids[1:3])
    [cut] = policy.generate([context], greedy.replace(stop=(stop,)))
    assert cut.finish_reason == "stop" and cut.text.endswith(stop)

    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    policy.load_state_dict(model.state_dict())
    [after] = policy.generate([context], greedy)
    assert after.token_ids != first.token_ids

    policy.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        policy.generate([context], greedy)
    policy.wake_up()
    assert policy.generate([context], greedy)[0].num_tokens > 0
