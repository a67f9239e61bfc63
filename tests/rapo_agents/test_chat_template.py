"""Chat templates come with a checkpoint's tokenizer config: a hostile one is stopped, not left to hang."""

from __future__ import annotations

import pytest

from rapo_agents import chat_template
from rapo_agents.chat_template import ChatTemplateTimeoutError, render_chat_template
from rapo_agents.rollout.episode import render_prompt

# Jinja's sandbox caps range() at 100,000 items, but not loops over loops: 10^10 empty iterations.
HOSTILE_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}hi"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture
def tokenizer(policy_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_tokenizer_dir)


def test_an_ordinary_template_renders_as_without_the_limit(tokenizer):
    expected = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert render_chat_template(tokenizer, MESSAGES, tokenize=False, add_generation_prompt=True) == expected


def test_a_hostile_template_is_stopped_at_the_time_limit(tokenizer):
    tokenizer.chat_template = HOSTILE_TEMPLATE
    with pytest.raises(ChatTemplateTimeoutError, match="over 0.2 s"):
        render_chat_template(tokenizer, MESSAGES, time_limit_s=0.2, tokenize=False)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"  # the limit is lifted afterwards
    assert render_chat_template(tokenizer, MESSAGES, tokenize=False) == "What is 2 + 2?"


def test_rendering_an_episodes_prompt_is_time_limited(tokenizer, monkeypatch):
    monkeypatch.setattr(chat_template, "CHAT_TEMPLATE_TIME_LIMIT_S", 0.2)
    tokenizer.chat_template = HOSTILE_TEMPLATE
    with pytest.raises(ChatTemplateTimeoutError):
        render_prompt(tokenizer, "", "What is 2 + 2?")
