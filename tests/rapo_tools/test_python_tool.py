"""The <python> tool through the Tool interface (subprocess backend), sync and async."""

import asyncio

import pytest

from rapo_tools.python_tool import PythonTool


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(sandbox={"backend": "subprocess", "timeout_s": 2})
    yield tool
    tool.close()


def test_a_final_bare_expression_is_printed_like_a_repl(tool):
    assert tool.call("x = 6\nx * 7").text.strip() == "42"
    assert tool.call("None").text.startswith("(no output")


def test_errors_return_the_useful_tail_of_the_traceback(tool):
    result = tool.call("def f():\n    return 1 / 0\nf()")
    assert not result.ok and "ZeroDivisionError" in result.text and "RUNNER" not in result.text
    assert 'File "<code>", line 2, in f' in result.text


def test_timeouts_are_reported(tool):
    result = tool.call("while True: pass")
    assert result.timed_out and not result.ok and "timed out" in result.text


def test_output_is_capped(tool):
    result = tool.call("print('x' * 10_000_000)")
    assert result.truncated and len(result.text) <= tool.max_result_chars


def test_empty_code_is_a_bad_input_result(tool):
    result = tool.call("   \n")
    assert not result.ok and result.error == "bad_input"


def test_concurrent_async_calls(tool):
    async def many():
        return await asyncio.gather(*(tool.acall(f"print({i} ** 2)") for i in range(6)))

    results = asyncio.run(many())
    assert [r.text.strip() for r in results] == [str(i ** 2) for i in range(6)]
