"""Corpus readers and passage stores on the real corpus samples and on malformed files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rapo_tools.search.corpus import (
    CorpusFormatError,
    JsonlPassageStore,
    detect_format,
    iter_passages,
    open_passage_store,
    scan_offsets,
)


def test_wiki18_jsonl_is_streamed_with_titles_split_from_contents(shared_data):
    path = shared_data / "corpus/flashrag_wiki18_sample_1000.jsonl"
    assert detect_format(path) == "jsonl"
    passages = iter_passages(path)
    first = next(passages)  # a generator: nothing beyond the first line is parsed yet
    assert first.id == "0" and first.title == "Evan Morris"
    assert first.text.startswith("Evan Morris Evan L. Morris")
    assert first.contents.startswith('"Evan Morris"\n')
    assert sum(1 for _ in passages) == 999


def test_hotpotqa_title_to_sentences_dict(shared_data):
    passages = list(iter_passages(shared_data / "corpus/hipporag_hotpotqa_train_corpus.json"))
    assert len(passages) == 994
    assert passages[0].title == "Demon Dice"
    assert "collectible dice game" in passages[0].text and "loyal fanbase" in passages[0].text


def test_title_text_list_json_and_kilt_jsonl(shared_data):
    wiki2 = open_passage_store(shared_data / "corpus/hipporag_2wikimultihopqa_corpus.json")
    assert len(wiki2) == 6119 and wiki2[0].title == "Teutberga"
    kilt = open_passage_store(shared_data / "corpus/r1searcher_kilt_wiki_pages_sample.jsonl")
    assert len(kilt) == 99 and kilt[0].title == "A" and kilt[0].text.startswith("A (named")


def test_jsonl_store_reads_the_same_passages_as_the_stream(shared_data):
    path = shared_data / "corpus/flashrag_wiki18_sample_1000.jsonl"
    store = open_passage_store(path)
    assert isinstance(store, JsonlPassageStore)
    streamed = list(iter_passages(path))
    assert [store[i] for i in (0, 1, 500, 999)] == [streamed[i] for i in (0, 1, 500, 999)]
    assert store[-1] == streamed[-1]
    with pytest.raises(IndexError):
        store[1000]
    store.close()
    store.close()


def test_malformed_lines_are_skipped_and_rows_stay_aligned(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        json.dumps({"id": "a", "contents": '"A"\nfirst'}),
        "{not json",
        "",
        json.dumps(["a list"]),
        json.dumps({"title": "B", "text": ["sentence one.", " sentence two."]}),
    ]
    path.write_text("\n".join(lines) + "\n")
    offsets = scan_offsets(path)
    assert offsets.dtype == np.int64 and len(offsets) == 2
    store = open_passage_store(path, offsets=offsets)
    assert [p.title for p in store] == ["A", "B"]
    assert store[1].text == "sentence one. sentence two."
    assert [p.title for p in iter_passages(path)] == ["A", "B"]


def test_unusable_files_get_clear_errors(tmp_path):
    with pytest.raises(CorpusFormatError, match="no corpus file"):
        detect_format(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CorpusFormatError, match="empty"):
        detect_format(empty)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("42")
    with pytest.raises(CorpusFormatError, match="JSON int"):
        list(iter_passages(scalar))
    with pytest.raises(ValueError, match="corpus_format"):
        list(iter_passages(scalar, corpus_format="xml"))
