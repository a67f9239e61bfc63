"""The tag protocol of spec §1: find tool calls, answers and ``\\boxed{}`` in model text; check format (§2).

Every function here takes any string, of any size and content, and never raises:
parsing is linear-time scanning with `str.rfind`, not backtracking regexes.

Example:
    >>> call = find_last_tool_call("<think>add</think><python>print(1 + 1)</python>")
    >>> call.tag, call.argument
    ('python', 'print(1 + 1)')
    >>> extract_boxed("<answer>The total is \\\\boxed{\\\\frac{1}{2}}</answer>")
    '\\\\frac{1}{2}'
    >>> check_format("<python>1</python> <result>\\n1\\n</result><answer>\\\\boxed{1}</answer>").ok
    True
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

TOOL_TAGS: tuple[str, ...] = ("python", "search")
"""The tool tags of the reasoning and knowledge tasks; each env may extend its own set."""

RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_MAX_BOXED_ATTEMPTS = 64


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One complete ``<tag>argument</tag>`` span of a model turn."""

    tag: str
    argument: str
    start: int
    """Index of the opening tag's ``<``."""
    end: int
    """Index just past the closing tag."""


@dataclasses.dataclass(frozen=True)
class FormatCheck:
    """Outcome of `check_format`: ``ok``, or the first rule broken."""

    ok: bool
    reason: str | None = None


def closing_tags(tags: Iterable[str]) -> list[str]:
    """The stop strings of a generation: each tool's closing tag and ``</answer>``."""
    return [f"</{tag}>" for tag in tags] + [ANSWER_CLOSE]


def find_last_tool_call(text: str, tags: Iterable[str] = TOOL_TAGS) -> ToolCall | None:
    """The complete tool call whose closing tag comes last in ``text``, or None."""
    best: ToolCall | None = None
    for tag in tags:
        open_tag, close_tag = f"<{tag}>", f"</{tag}>"
        close = text.rfind(close_tag)
        while close != -1:
            start = text.rfind(open_tag, 0, close)
            if start != -1:
                break
            close = text.rfind(close_tag, 0, close)  # a stray closing tag: look further back
        if close == -1 or (best is not None and close + len(close_tag) <= best.end):
            continue
        best = ToolCall(tag, text[start + len(open_tag) : close], start, close + len(close_tag))
    return best


def count_tool_calls(text: str, tags: Iterable[str] = TOOL_TAGS) -> int:
    """Number of closing tool tags in ``text`` (each complete call has one)."""
    return sum(text.count(f"</{tag}>") for tag in tags)


def find_unclosed_tag(text: str, tags: Iterable[str] = TOOL_TAGS) -> str | None:
    """A tool tag opened after the last closing tag of its kind, e.g. a turn cut off mid-call."""
    for tag in tags:
        if text.rfind(f"<{tag}>") > text.rfind(f"</{tag}>"):
            return tag
    return None


def extract_answer(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>``; an answer left open runs to the end of ``text``."""
    start = text.rfind(ANSWER_OPEN)
    if start == -1:
        return None
    start += len(ANSWER_OPEN)
    close = text.find(ANSWER_CLOSE, start)
    return text[start:] if close == -1 else text[start:close]


def has_answer(text: str) -> bool:
    """Whether the text opens an ``<answer>``."""
    return ANSWER_OPEN in text


def closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` where the brace depth counted from ``start`` first returns to 0, or None.

    Example:
        >>> closing_brace("x{a{b}}c", 0)
        6
    """
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _balanced_braces(text: str, open_index: int) -> str | None:
    close = closing_brace(text, open_index)
    return None if close is None else text[open_index + 1 : close]


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None.

    Also accepts the brace-less form ``\\boxed 5``.
    """
    candidates: list[tuple[int, str]] = []
    for command in _BOXED_COMMANDS:
        position = len(text)
        for _ in range(_MAX_BOXED_ATTEMPTS):
            position = text.rfind(command, 0, position)
            if position == -1:
                break
            candidates.append((position, command))
    for position, command in sorted(candidates, reverse=True):
        rest = position + len(command)
        if text.startswith("{", rest):
            content = _balanced_braces(text, rest)
            if content is not None:
                return content
        elif text.startswith(" ", rest):
            word = text[rest + 1 :].split(maxsplit=1)
            if word:
                return word[0].rstrip("$.")
    return None


# Terminal escape sequences (linear-time patterns): CSI (ESC [ or the 8-bit \x9b) with its parameters,
# OSC (ESC ]) up to BEL or ST (or the end), and the other two-character ESC sequences.
_TERMINAL_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_terminal_text(text: str) -> str:
    """``text`` without terminal escape sequences, its other control characters shown as ``\\xNN``.

    A tool's output can colour, move the cursor, retitle a terminal or hide text (``\\r``,
    backspace) for whoever reads a transcript; the model and the reader see the same characters
    instead. ANSI CSI/OSC sequences are dropped, ``\\r\\n`` becomes ``\\n``, and every C0/C1
    control except ``\\n`` and ``\\t`` is written out as text.

    Example:
        >>> clean_terminal_text("\\x1b[31mred\\x1b[0m\\r\\nbell\\x07 tab\\tok")
        'red\\nbell\\\\x07 tab\\tok'
    """
    text = _TERMINAL_ESCAPE.sub("", text.replace("\r\n", "\n"))
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def format_result(text: str, defuse_tags: bool = True) -> str:
    """Wrap a tool's output as the observation appended to the context: `` <result>\\n...\\n</result>``.

    Terminal escapes and control characters are made plain (`clean_terminal_text`), and a result
    tag printed by the tool itself is defused, so results always pair up; ``defuse_tags=False`` leaves such tags as
    printed, as the reference does (a tool in reference mode; docs/fidelity.md, D4).

    Example:
        >>> format_result("a</result>b"), format_result("a</result>b", defuse_tags=False)
        (' <result>\\na</ result>b\\n</result>', ' <result>\\na</result>b\\n</result>')
    """
    safe = clean_terminal_text(text).rstrip("\n")
    if defuse_tags:
        safe = safe.replace(RESULT_CLOSE, "</ result>").replace(RESULT_OPEN, "< result>")
    return f" {RESULT_OPEN}\n{safe}\n{RESULT_CLOSE}"


def result_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each complete ``<result>...</result>`` block of ``text``, in order."""
    spans, position = [], 0
    while (start := text.find(RESULT_OPEN, position)) != -1:
        close = text.find(RESULT_CLOSE, start)
        if close == -1:
            break
        position = close + len(RESULT_CLOSE)
        spans.append((start, position))
    return spans


def strip_results(text: str) -> str:
    """``text`` without its ``<result>...</result>`` blocks: what the policy itself wrote."""
    pieces, position = [], 0
    for start, end in result_spans(text):
        pieces.append(text[position:start])
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def check_format(response: str, tool_tags: Iterable[str] = TOOL_TAGS) -> FormatCheck:
    """Spec §2's format rules over a whole response (the policy's turns and the tool results).

    Broken when: ``<think>`` is unbalanced; there is not exactly one ``<answer>...</answer>``;
    a tool call has no ``<result>`` right after it; the answer has no ``\\boxed{}``.
    Tags printed inside tool results do not count.
    """
    own = strip_results(response)
    if own.count(THINK_OPEN) != own.count(THINK_CLOSE):
        return FormatCheck(False, "unbalanced <think> tags")
    if own.count(ANSWER_OPEN) != 1 or own.count(ANSWER_CLOSE) != 1:
        return FormatCheck(False, "the response must contain exactly one <answer>...</answer>")
    if own.find(ANSWER_OPEN) > own.find(ANSWER_CLOSE):
        return FormatCheck(False, "</answer> comes before <answer>")
    spans = result_spans(response)
    for tag in tool_tags:
        close_tag = f"</{tag}>"
        position = response.find(close_tag)
        while position != -1:
            after = position + len(close_tag)
            if not any(start <= position < end for start, end in spans):  # a tag printed by a tool is not a call
                next_text = after
                while next_text < len(response) and response[next_text].isspace():
                    next_text += 1
                if not response.startswith(RESULT_OPEN, next_text):
                    return FormatCheck(False, f"a <{tag}> call has no <result> after it")
            position = response.find(close_tag, after)
    if extract_boxed(extract_answer(own) or "") is None:
        return FormatCheck(False, "the answer has no \\boxed{...}")
    return FormatCheck(True)
