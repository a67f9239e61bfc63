"""The python tool with ``sandbox.output="reference"`` reads as the official RAPO tool and rollout loop.

Reference behaviour (RAPO commit 480af9d, ``workers/rollout/tools/python_tool.py`` and
``vllm_rollout_with_tools.py``): the last expression is wrapped in ``print()`` (``str``, ``None`` too),
success returns ``stdout.strip()``, failure ``stderr.strip()``, empty output is retried 3 times and
then reported as ``Tool(python) returned empty output.``, and an empty call ends the rollout.
"""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401  (registers the envs)
from rapo_tools.python_tool import EMPTY_CALL, REFERENCE_ATTEMPTS, PythonTool
from rapo_tools.sandbox import SandboxConfig
from rapo_tools.sandbox.repl import format_execution_output, print_last_expression

BACKENDS = ["subprocess", "local"]


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request):
    settings = {"backend": request.param, "timeout_s": 5, "pool_size": 1, "light_pool": False}
    paper, reference = PythonTool(settings), PythonTool(settings | {"output": "reference"})
    yield paper, reference
    paper.close()
    reference.close()


@pytest.mark.parametrize(("code", "paper_text", "reference_text"), [
    ("'a' * 2", "'aa'\n", "aa"),
    ("x = [1, 'b']\nx", "[1, 'b']\n", "[1, 'b']"),
    ("None", "(no output; print() what you need to see)", "None"),
    ("def f():\n    pass\nf()", "(no output; print() what you need to see)", "None"),
    ("print(5)", "5\n", "5"),
    ("print('  padded  ')", "  padded  \n", "padded"),
    ("import math\nmath.pi > 3", "True\n", "True"),
    ("x, y = 1, 2\nx, y", "(1, 2)\n", "(1, 2)"),
    ("1,", "(1,)\n", "(1,)"),
    ("x = [3]\n*x, 'a'", "(3, 'a')\n", "(3, 'a')"),
])
def test_final_expressions_print_str_and_none_in_reference_mode(pair, code, paper_text, reference_text):
    paper, reference = pair
    assert paper.call(code).text == paper_text
    assert reference.call(code).text == reference_text


def test_a_failure_shows_stderr_alone_in_reference_mode(pair):
    paper, reference = pair
    code = "print('partial')\n1 / 0"
    paper_result, reference_result = paper.call(code), reference.call(code)
    assert not paper_result.ok and paper_result.text.startswith("partial")
    assert not reference_result.ok and "partial" not in reference_result.text
    assert reference_result.text.startswith("Traceback") and reference_result.text.endswith("division by zero")


def test_empty_output_is_retried_then_reported_with_the_reference_message(tmp_path):
    counter = tmp_path / "runs"
    tool = PythonTool({"backend": "subprocess", "output": "reference"})
    try:
        result = tool.call(f"open({str(counter)!r}, 'a').write('x')\nx = 1")
        assert result.text == "Tool(python) returned empty output." and not result.ok
        assert counter.read_text() == "x" * REFERENCE_ATTEMPTS == "xxx"
        # A failure with nothing on stderr is empty output too.
        assert tool.call("import sys\nsys.exit(3)").text == "Tool(python) returned empty output."
        # Output on a later attempt is returned as soon as it comes.
        flaky = (f"open({str(counter)!r}, 'a').write('y')\n"
                 f"if open({str(counter)!r}).read().endswith('yy'): print('ok')")
        assert tool.call(flaky).text == "ok"
    finally:
        tool.close()


def test_an_empty_call_is_marked_to_end_the_episode_in_reference_mode_only(pair):
    paper, reference = pair
    assert paper.call(" \n").error == "bad_input"
    result = reference.call("  \n\t")
    assert result.error == EMPTY_CALL and not result.ok and result.text == ""


def test_an_empty_python_call_ends_a_reference_mode_episode():
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox={"backend": "subprocess", "output": "reference"})
    try:
        env.reset(options={"task_index": 0})
        observation, reward, terminated, truncated, info = env.step("<think>t</think><python>\n</python>")
        assert truncated and not terminated and observation == ""
        assert info["episode_end"] == "empty_call" and info["tool_error"] == EMPTY_CALL
        assert reward == -1.0  # the call has no <result>: bad format
    finally:
        env.close()


def test_the_paper_mode_episode_goes_on_after_an_empty_call():
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess")
    try:
        env.reset(options={"task_index": 0})
        observation, _, terminated, truncated, info = env.step("<python>\n</python>")
        assert not (terminated or truncated) and "empty" in observation and info["tool_error"] == "bad_input"
    finally:
        env.close()


def test_print_last_expression_wraps_only_a_final_bare_expression():
    assert print_last_expression("x = 1\nx + 1") == "x = 1\nprint(x + 1)"
    assert print_last_expression("x = 1\r\n(x +\n 2)  # note") == "x = 1\r\n(print(x +\n 2))  # note"
    assert print_last_expression("s = 'é'; s * 2") == "s = 'é'; print(s * 2)"
    assert print_last_expression("x, y") == "print((x, y))"  # one tuple, as the reference's ast.unparse prints
    for unchanged in ("print(1)", "x = 1", "if x:\n    x", "syntax error(", ""):
        assert print_last_expression(unchanged) == unchanged


def test_reference_formatting_is_strip_of_one_stream():
    assert format_execution_output(" out \n", "warn", 0, "reference") == ("out", True)
    assert format_execution_output("out", " err \n", 1, "reference") == ("err", False)
    assert format_execution_output("", "", -9, "reference") == ("", False)
    assert format_execution_output("out\n", "err", 1) == ("out\nerr", False)  # paper keeps both


def test_the_output_setting_is_validated():
    with pytest.raises(ValueError, match="output"):
        SandboxConfig(output="verbose")
