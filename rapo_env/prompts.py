"""System prompts: the tag protocol explained to the model, in rapo's own words.

The prompt belongs to the env, since the env decides which tools exist. It reaches the
agent in ``info["system_prompt"]`` on reset.

Example:
    >>> prompt = build_system_prompt({"python": "runs Python code and shows what it prints"})
    >>> "<python>" in prompt and "\\\\boxed{}" in prompt
    True
"""

from __future__ import annotations

from collections.abc import Mapping

TOOL_DESCRIPTIONS: dict[str, str] = {
    "python": "a Python interpreter: it runs your code and shows what it prints "
    "(a final bare expression is printed too)",
    "search": "a Wikipedia search engine: it returns the passages most relevant to your query",
    "browse": "a web browser: give it a URL and it returns the readable text of the page",
}


def build_system_prompt(tools: Mapping[str, str], max_tool_calls: int | None = None) -> str:
    """Explain the tags and the given tools (tag -> what it does) to the model."""
    tool_lines = "\n".join(f"- <{tag}> ... </{tag}>: {description}." for tag, description in tools.items())
    budget = f" You may call tools at most {max_tool_calls} times." if max_tool_calls else ""
    return (
        "You are a helpful assistant who solves the user's question step by step, calling tools when they help.\n"
        "Think before you act, inside <think> </think>. To call a tool, write its tag around your input:\n"
        f"{tool_lines}\n"
        "After each call, stop and wait: the result comes back inside <result> </result>."
        f"{budget}\n"
        "When you are sure, give the final answer inside <answer> </answer>, with the exact final answer "
        "in \\boxed{}, for example <answer>The total is \\boxed{42}</answer>."
    )


SHORT_MATH_PROMPT = (
    "Solve the problem. Think inside <think> </think>. Run Python inside <python> </python>; what it prints comes "
    "back inside <result> </result>. Give the final answer as <answer>\\boxed{N}</answer>."
)
"""The math env's protocol in three sentences (about 55 tokens against about 200): ``system_prompt="short"``. The
embedded CPU training run uses it, since every prompt token is paid for in every update."""


SHORT_QA_PROMPT = (
    "Answer the question. Think inside <think> </think>. Search inside <search> </search>, one name per search; "
    "the passages come back inside <result> </result>. Give the final answer as <answer>\\boxed{answer}</answer>."
)
"""The QA env's protocol in three sentences (about 60 tokens against about 150): ``system_prompt="short"``, as
`SHORT_MATH_PROMPT` is for math."""

SHORT_PROMPTS = {"RAPO-Math-v0": SHORT_MATH_PROMPT, "RAPO-QA-v0": SHORT_QA_PROMPT}
"""The envs that take ``system_prompt="short"``, and their short prompts."""


REFERENCE_FALLBACK_TEXT = (
    " \n<think> Solve this problem carefully using own reasoning without tool calls. "
    "Think step by step and self-check before answering.</think>\n"
)
"""The official code's splice when the best retrieved candidate's reward is <= 0 (``RetrieveTool``), in its
``<think>`` wrapper; the retrieval wrapper uses it with ``hybrid_rule="reference"``."""
