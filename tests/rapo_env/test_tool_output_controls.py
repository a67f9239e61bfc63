"""Terminal escapes and control characters in a tool's output never reach the observation as they are.

A program can print colour codes, a terminal title, a carriage return that hides what came before
it, or a NUL; the model (and whoever reads the transcript) sees plain text instead.
"""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401  (registers the envs)
from rapo_env.protocol import clean_terminal_text, format_result


@pytest.mark.parametrize(("raw", "clean"), [
    ("\x1b[1;31mred\x1b[0m", "red"),
    ("\x1b]0;new title\x07after", "after"),
    ("\x1b]8;;http://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),
    ("\x9b2Jcleared", "cleared"),
    ("secret\rshown", "secret\\x0dshown"),
    ("a\x08b\x00c\x7f", "a\\x08b\\x00c\\x7f"),
    ("line\r\nnext\ttab", "line\nnext\ttab"),
    ("é 漢字 ok", "é 漢字 ok"),
])
def test_escapes_are_dropped_and_controls_written_out(raw, clean):
    assert clean_terminal_text(raw) == clean


def test_every_result_is_cleaned_when_it_is_wrapped():
    assert format_result("\x1b[2K\x1b[1Aok\x07") == " <result>\nok\\x07\n</result>"


def test_a_python_program_cannot_put_escapes_into_the_observation():
    env = gym.make("RAPO-Math-v0", num_tasks=1, sandbox="subprocess")
    try:
        env.reset(seed=0)
        code = "print('\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07 done\\x00')"
        observation, *_ = env.step(f"<python>{code}</python>")
    finally:
        env.close()
    assert "\x1b" not in observation and "\x07" not in observation and "\x00" not in observation
    assert "red done\\x00" in observation
