"""Chat templates rendered under a time limit: a checkpoint's tokenizer config may carry a hostile template.

A chat template is Jinja code that ships with the tokenizer (``tokenizer_config.json`` or
``chat_template.jinja``), so a shared checkpoint can hang every prompt with nested loops; Jinja's sandbox
bounds ``range`` but not loops over loops. `render_chat_template` runs ``apply_chat_template`` under a
per-thread trace that raises `ChatTemplateTimeoutError` once the time limit has passed (it works in any
thread, unlike an alarm signal). Not covered: a single C-level operation that is slow by itself.

Example:
    >>> class Echo:
    ...     def apply_chat_template(self, messages, **options):
    ...         return " | ".join(message["content"] for message in messages)
    >>> render_chat_template(Echo(), [{"role": "user", "content": "hi"}], tokenize=False)
    'hi'
"""

from __future__ import annotations

import sys
import time
from typing import Any

CHAT_TEMPLATE_TIME_LIMIT_S = 10.0
"""Seconds one prompt's rendering may take (an ordinary template takes well under a millisecond)."""


class ChatTemplateTimeoutError(RuntimeError):
    """Rendering the chat template took longer than its time limit: the template is hostile or broken."""


def render_chat_template(tokenizer: Any, messages: list[dict[str, Any]], time_limit_s: float | None = None,
                         **options: Any) -> Any:
    """``tokenizer.apply_chat_template(messages, **options)``, stopped after ``time_limit_s`` seconds
    (default `CHAT_TEMPLATE_TIME_LIMIT_S`).

    Raises:
        ChatTemplateTimeoutError: when the rendering passes the time limit.
    """
    limit = CHAT_TEMPLATE_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    deadline = time.monotonic() + limit

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise ChatTemplateTimeoutError(f"the chat template took over {limit:g} s to render a prompt "
                                           "(a hostile or broken template in the tokenizer config?)")
        # Line by line only in the template's own compiled code (Jinja names it "<template>"): its loops may
        # call nothing at all; elsewhere each call is checked, which costs far less.
        return trace if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return tokenizer.apply_chat_template(messages, **options)
    finally:
        sys.settrace(previous)
