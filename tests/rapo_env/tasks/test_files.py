"""Loading the real benchmark files in their reference formats."""

import json

import pytest

from rapo_env.tasks import TaskFileError, load_tasks, resolve_tasks


@pytest.mark.parametrize("relative, count, first_answer", [
    ("math/gsm8k_test.jsonl", 1319, "18"),
    ("math/math500_test.jsonl", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("math/aime24_test.jsonl", 30, "204"),
    ("math/aime25_test.jsonl", 30, "70"),
    ("qa/arpo_hotpotqa_test.jsonl", 200, "Frank Lowy"),
    ("web/arpo_gaia_text_validation.jsonl", 103, "34689"),
])
def test_reference_files_load_with_their_answers(shared_data, relative, count, first_answer):
    tasks = load_tasks(shared_data / relative)
    assert len(tasks) == count
    assert tasks[0].answers[0] == first_answer


def test_the_rl_parquet_reads_the_chat_prompt_and_filters_by_ability(shared_data):
    tasks = load_tasks(shared_data / "math/arpo_rl_train_10k.parquet", ability="math")
    assert 4990 <= len(tasks) <= 5000  # the 5,000 math rows, less any without a ground truth
    assert "Triangle" in tasks[0].question
    assert "<python>" in tasks[0].metadata["system_prompt"]


def test_alias_joined_answers_are_split(shared_data):
    task = load_tasks(shared_data / "qa/deepresearcher_dev.parquet")[0]
    assert len(task.answers) > 1 and "türkiye" in task.answers


def test_list_answers_are_aliases(shared_data):
    answers = load_tasks(shared_data / "qa/arpo_2wiki_test.jsonl")[0].answers
    assert answers[:3] == ("the five boroughs", "City of New York", "New York") and "NYC" in answers


def test_corrupt_lines_are_skipped_and_empty_files_rejected(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": 3}) + "\n{not json\n" + json.dumps({"x": 1}) + "\n")
    tasks = load_tasks(path)
    assert [task.answers for task in tasks] == [("3",)]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TaskFileError, match="holds no task"):
        load_tasks(empty)
    with pytest.raises(TaskFileError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_unknown_dataset_names_say_what_is_accepted():
    with pytest.raises(TaskFileError, match="procedural"):
        resolve_tasks("gsm9k", "train", procedural=lambda split: [])
