"""The text normalisation applied, identically, to buffer keys and to retrieval queries (spec §3).

1. drop the system prompt: everything up to the start of the first user turn, when the text is a
   chat transcript (chat-template markers, or the ``system\\n...\\nuser\\n`` form that decoding with
   ``skip_special_tokens`` leaves);
2. remove chat role headers and special tokens (``<|im_start|>assistant``, ``<|eot_id|>``, ...);
3. keep the last ``max_chars`` (1,300) characters;
4. replace lone surrogates (text that is not valid Unicode, which the encoder's tokenizer refuses) with U+FFFD.

Both cuts keep the newest context, and so does the encoder after them: the step-trace encoders
(`rapo_tools.search.embedding.BUFFER_ENCODER` and ``REFERENCE_BUFFER_ENCODER``) drop the tokens beyond
their limit from the left as well, for keys and queries alike (the reference cut the tokens from the
right, losing the end of the 1,300 characters whenever they exceeded its token limit).

The reference applied this to keys only, so that its queries kept special tokens its keys lacked.
Here one function serves both, and it is idempotent, so that a client may normalise a query before
sending it and the server may normalise it again.

Example:
    >>> normalize_context("<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nWhat is 2+3?<|im_end|>")
    'What is 2+3?'
    >>> normalize_context("x" * 2000) == "x" * 1300
    True
"""

from __future__ import annotations

import re

MAX_CONTEXT_CHARS = 1300
"""Characters of context kept for embedding (the reference's value)."""

# Where a user turn begins in the chat templates rapo's models use (Qwen/SmolLM ChatML, Llama 3, Phi/Zephyr).
_USER_TURN_MARKERS = (
    "<|im_start|>user\n",
    "<|start_header_id|>user<|end_header_id|>\n\n",
    "<|start_header_id|>user<|end_header_id|>",
    "<|user|>\n",
    "<|user|>",
)
# The same transcript decoded without special tokens ("system\n...\nuser\n..."), as the reference embeds it.
_DECODED_SYSTEM_PREFIX = "system\n"
_DECODED_USER_MARKER = "\nuser\n"
# Role headers go whole (not only their special tokens), so that "assistant" does not stay in the text.
_ROLE_HEADER = re.compile(r"<\|im_start\|>[a-z_]+\n?|<\|start_header_id\|>[a-z_]+<\|end_header_id\|>\n*")
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|\[/?INST\]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def drop_system_prompt(text: str) -> str:
    """Return ``text`` from the start of its first user turn; unchanged when it is not a chat transcript."""
    for marker in _USER_TURN_MARKERS:
        position = text.find(marker)
        if position >= 0:
            return text[position + len(marker) :]
    if text.startswith(_DECODED_SYSTEM_PREFIX):
        position = text.find(_DECODED_USER_MARKER)
        if position >= 0:
            return text[position + len(_DECODED_USER_MARKER) :]
    return text


def normalize_context(text: str, max_chars: int = MAX_CONTEXT_CHARS) -> str:
    """Normalise a key or a query for embedding: no system prompt, no special tokens, the last ``max_chars``,
    valid Unicode.

    Raises:
        ValueError: when ``max_chars`` is not positive.
    """
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    text = _SPECIAL_TOKEN.sub("", _ROLE_HEADER.sub("", drop_system_prompt(text)))
    return _LONE_SURROGATE.sub("\ufffd", text[-max_chars:].strip())
