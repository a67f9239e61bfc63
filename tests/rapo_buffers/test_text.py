"""Key/query normalisation (spec §3): no system prompt, no special tokens, the last 1,300 characters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapo_buffers.text import MAX_CONTEXT_CHARS, normalize_context

QUESTION = "A farm has 12 cows. How many legs?"


@pytest.mark.parametrize(
    "transcript",
    [
        f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n",
        f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{QUESTION}<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
        f"system\nYou are helpful.\nuser\n{QUESTION}",  # decoded with skip_special_tokens, as the reference embeds keys
        QUESTION,  # rapo's own keys and queries: the user turn only
    ],
)
def test_system_prompt_and_special_tokens_are_dropped(transcript):
    normalized = normalize_context(transcript)
    assert normalized.startswith(QUESTION)
    assert "helpful" not in normalized and "<|" not in normalized


def test_keeps_the_last_characters():
    text = "".join(chr(ord("a") + i % 26) for i in range(5000))
    assert normalize_context(text) == text[-MAX_CONTEXT_CHARS:]
    assert normalize_context(text, max_chars=10) == text[-10:]
    with pytest.raises(ValueError):
        normalize_context(text, max_chars=0)


def test_a_query_and_the_key_of_the_same_context_normalise_identically():
    history = "<think>legs per cow</think>\n<python>\n12*4\n</python> <result>\n48\n</result>"
    key = QUESTION + history  # how the builder stores contexts
    query = (
        f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>"
        f"<|im_start|>assistant\n{history}"
    )  # how a chat-templated rollout sees it
    assert normalize_context(key) == normalize_context(query)
    long_history = history * 30  # past 1,300 characters only the tail counts
    assert normalize_context(QUESTION + long_history) == normalize_context(query + long_history)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=3000))
def test_idempotent(text):
    once = normalize_context(text)
    assert normalize_context(once) == once
    assert len(once) <= MAX_CONTEXT_CHARS


def test_lone_surrogates_become_replacement_characters_so_any_context_can_be_embedded(scripted_buffer):
    assert normalize_context("bolts \ud800 and \udfff nuts") == "bolts \ufffd and \ufffd nuts"
    assert scripted_buffer.retriever.retrieve(["How many bolts \ud800?"], topk=1)[0]  # the tokenizer accepts it
