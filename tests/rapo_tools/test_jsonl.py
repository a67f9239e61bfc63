"""rapo's one JSONL helper: bad lines skipped and counted by number, whole-file writes atomic."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from rapo_tools.jsonl import JsonlReader, dumps_line, loads_line, read_jsonl, write_jsonl


def test_round_trip_keeps_unicode_numpy_and_non_string_keys(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"text": "Zürich — 東京", "score": np.float32(0.5), "counts": {1: 2}}, {"ids": np.arange(3)}]
    assert write_jsonl(path, rows) == 2
    assert read_jsonl(path) == [{"text": "Zürich — 東京", "score": 0.5, "counts": {"1": 2}}, {"ids": [0, 1, 2]}]
    assert path.read_bytes().count(b"\n") == 2


def test_bad_lines_are_skipped_counted_and_located(tmp_path, caplog):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": 1}\n\nnot json\n{"id": "x"}\n\xff\xfe\n{"id": 2}\n{"id": 3, "to')

    def parse(value):
        return int(value["id"])

    reader = JsonlReader(path, parse, what="id records")
    with caplog.at_level(logging.WARNING):
        assert list(reader) == [1, 2]
    assert [number for number, _ in reader.skipped] == [3, 4, 5, 7]
    assert reader.lines == 6
    assert "skipped 4 lines that are not id records (the first, line 3" in caplog.text


def test_each_good_record_comes_with_its_line_number_and_the_byte_offset_to_seek_back_to(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": 1}\nnot json\n\n{"id": 2}\n')
    positions = list(JsonlReader(path).with_positions())
    assert [(number, record) for number, _, record in positions] == [(1, {"id": 1}), (4, {"id": 2})]
    with path.open("rb") as handle:
        handle.seek(positions[1][1])
        assert loads_line(handle.readline()) == {"id": 2}


def test_old_json_dumps_output_with_nan_still_reads():
    assert np.isnan(loads_line(b'{"loss": NaN}')["loss"])
    assert loads_line(str(2**70)) == 2**70
    with pytest.raises(ValueError, match="not JSON"):
        loads_line(b"{oops")
    assert dumps_line({"a": float("nan")}) == b'{"a":null}\n'


def test_a_failed_rewrite_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"id": 1}])

    def records():
        yield {"id": 2}
        raise RuntimeError("the producer crashed half-way")

    with pytest.raises(RuntimeError):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"id": 1}]
    assert os.listdir(tmp_path) == ["rows.jsonl"]  # no temporary file left behind


def test_append_adds_whole_lines(tmp_path):
    path = tmp_path / "nested" / "rows.jsonl"
    write_jsonl(path, [{"id": 1}], append=True)
    write_jsonl(path, [{"id": 2}, {"id": 3}], append=True)
    assert [row["id"] for row in read_jsonl(path)] == [1, 2, 3]


def test_a_missing_file_is_an_error_not_an_empty_list(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "absent.jsonl")
