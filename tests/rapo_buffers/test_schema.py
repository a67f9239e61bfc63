"""StepTrace JSONL: reference compatibility, extra fields, tolerant reading."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapo_buffers.schema import StepTrace, read_buffer, write_buffer


def test_reads_a_reference_style_file_with_reward_lists_and_garbage(tmp_path):
    path = tmp_path / "Step_Trace_Buffer.jsonl"
    reference_lines = [
        {
            "key": "Q1",
            "value": "<python>1</python> <result>\n1\n</result>",
            "reward": 1.0,
            "answer": "1",
            "ground_truth": "1",
            "f1": 1.0,
        },
        [0.0, 1.0, 1.0],  # the reference writer mixes reward lists into the file
        {"key": "Q2", "value": "<answer>\\boxed{2}</answer>", "reward": 0},
    ]
    text = "\n".join(json.dumps(line) for line in reference_lines)
    text += '\n{"key": "no value"}\n{not json\n\n{"key": "Q3", "value": "v", "reward": "high"}\n\x00\xff binary\n'
    path.write_text(text, encoding="utf-8")
    traces, stats = read_buffer(path)
    assert [trace.key for trace in traces] == ["Q1", "Q2"]
    assert (stats.lines, stats.records, stats.skipped) == (7, 2, 5)
    assert traces[0].extra == {"ground_truth": "1", "f1": 1.0} and traces[0].answer == "1"
    assert not traces[0].final and traces[1].final  # inferred from <answer> when is_final is absent


def test_round_trip_keeps_every_field(tmp_path):
    trace = StepTrace(
        key="k",
        value="v",
        reward=0.5,
        question_id="q",
        step_index=2,
        is_final=False,
        answer="42",
        source="expert",
        extra={"f1": 0.5},
    )
    path = tmp_path / "buffer.jsonl"
    assert write_buffer(path, [trace]) == 1
    assert read_buffer(path)[0] == [trace]
    assert json.loads(path.read_text())["f1"] == 0.5


@pytest.mark.parametrize(
    "record",
    [
        None,
        [],
        "text",
        {"key": 1, "value": "v"},
        {"key": "k", "value": "v", "reward": float("nan")},
        {"key": "k", "value": "v", "reward": True},
    ],
)
def test_non_records_raise_value_error(record):
    with pytest.raises(ValueError):
        StepTrace.from_dict(record)


def test_missing_reward_defaults_to_zero():
    assert StepTrace.from_dict({"key": "k", "value": "v"}).reward == 0.0


@settings(max_examples=60, deadline=None)
@given(st.text(), st.text(), st.floats(allow_nan=False, allow_infinity=False), st.booleans())
def test_any_text_round_trips(tmp_path_factory, key, value, reward, is_final):
    path = tmp_path_factory.mktemp("rt") / "b.jsonl"
    trace = StepTrace(key=key, value=value, reward=reward, is_final=is_final)
    write_buffer(path, [trace])
    traces, stats = read_buffer(path)
    assert traces == [trace] and stats.skipped == 0
