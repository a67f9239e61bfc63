"""ScriptedPolicy and ByteTokenizer."""

from __future__ import annotations

from rapo_agents.policies import ByteTokenizer, SamplingParams, ScriptedPolicy


def test_byte_tokenizer_round_trips_unicode_and_renders_chat():
    tokenizer = ByteTokenizer()
    text = "naïve ∑ 数学 <python>"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")


def test_scripted_turns_follow_the_context_and_honour_stop_and_budget():
    turns = ["<think>go</think><python>\nprint(1)\n</python>trailing", "<answer>\\boxed{1}</answer>"]
    policy = ScriptedPolicy(turns)
    tokenizer = policy.tokenizer
    context = tokenizer.encode("Question")
    first = policy.generate([context], SamplingParams())[0]
    assert first.text == "<think>go</think><python>\nprint(1)\n</python>" and first.finish_reason == "stop"
    assert first.stop_string == "</python>" and first.logprobs == [0.0] * first.num_tokens
    second = policy.generate([context + first.token_ids + tokenizer.encode(" <result>1</result>")],
                             SamplingParams())[0]
    assert second.text == "<answer>\\boxed{1}</answer>"
    cut = policy.generate([context], SamplingParams(max_new_tokens=5))[0]
    assert cut.num_tokens == 5 and cut.finish_reason == "length"
    no_stop = policy.generate([context], SamplingParams(stop=()))[0]
    assert no_stop.finish_reason == "eos" and no_stop.token_ids[-1] == tokenizer.eos_token_id


def test_rule_based_turns():
    policy = ScriptedPolicy(lambda context: f"<answer>\\boxed{{{len(context)}}}</answer>")
    generation = policy.generate([policy.tokenizer.encode("abc")], SamplingParams())[0]
    assert generation.text == "<answer>\\boxed{3}</answer>"
