"""GSM8K converter: every calculator annotation becomes a python step with its real result."""

from __future__ import annotations

import json
import re

from rapo_agents.buffer_build.sources.gsm8k import evaluate_arithmetic, gsm8k_trajectories, solution_turns
from rapo_env.protocol import check_format, extract_boxed
from rapo_tools.python_tool import PythonTool

ANNOTATION = re.compile(r"<<([^<>]*)=([^<>=]*)>>")


def test_results_are_what_python_prints(shared_data):
    rows = [json.loads(line) for line in (shared_data / "math" / "gsm8k_train.jsonl").open()][:400]
    checked = 0
    for row in rows:
        for expression, annotated in ANNOTATION.findall(row["answer"]):
            value = evaluate_arithmetic(expression)
            assert value is not None, expression
            assert str(value) == str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (GSM8K arithmetic only)
            assert abs(float(value) - float(annotated.replace(",", ""))) <= 0.01 * max(1.0, abs(float(value))), (
                expression
            )
            checked += 1
    assert checked > 1000


def test_python_tool_agrees_on_a_sample(shared_data):
    trajectory = next(gsm8k_trajectories(shared_data / "math" / "gsm8k_train.jsonl", limit=1))
    tool = PythonTool(sandbox="subprocess")
    try:
        for step in trajectory.steps[:-1]:
            code = step.action.split("<python>\n", 1)[1].split("\n</python>", 1)[0]
            assert tool.call(code).text.strip() in step.observation
    finally:
        tool.close()


def test_whole_training_file_converts(shared_data):
    trajectories = list(gsm8k_trajectories(shared_data / "math" / "gsm8k_train.jsonl"))
    assert len(trajectories) == 7473
    annotations = sum(t.num_tool_calls for t in trajectories)
    unconverted = sum(t.metrics["unconverted_annotations"] for t in trajectories)
    assert annotations + unconverted == 23716 and unconverted == 0
    for trajectory in trajectories[:200]:
        assert check_format(trajectory.response).ok, trajectory.response
        assert extract_boxed(trajectory.response) is not None
        assert trajectory.prompt == trajectory.question and trajectory.reward == 1.0


def test_arithmetic_evaluator_refuses_anything_else():
    for expression in ("__import__('os')", "x*2", "2**10**10", "1/0", "[1]*3", "a.b", "9" * 300):
        assert evaluate_arithmetic(expression) is None
    assert evaluate_arithmetic("-(3+4)*2") == -14 and evaluate_arithmetic("7//2") == 3


def test_non_arithmetic_annotations_stay_as_text():
    turns = solution_turns("He buys x = <<x=5>>5 apples and 2*3 = <<2*3=6>>6 pears.\n#### 6")
    assert turns.unconverted == 1
    assert len(turns.steps) == 2
    assert "x = 5" in turns.steps[0][0] and "<python>\n2*3\n</python>" in turns.steps[0][0]
    assert solution_turns("no final answer here").answer is None


def test_bad_rows_are_skipped_and_counted_and_ids_keep_their_line(tmp_path, caplog):
    path = tmp_path / "gsm8k.jsonl"
    good = json.dumps({"question": "What is 2*3?", "answer": "2*3 = <<2*3=6>>6\n#### 6"})
    path.write_text("\n".join([good, "{torn", json.dumps({"question": "q", "answer": "no final answer"}), good]))
    with caplog.at_level("WARNING"):
        trajectories = list(gsm8k_trajectories(path))
    assert [t.task_id for t in trajectories] == ["gsm8k_train-0", "gsm8k_train-3"]
    assert "skipped 2 lines" in caplog.text and "line 2" in caplog.text
