"""Retrieval keys and queries keep their newest part: a context longer than the encoder's token limit is cut
from the left, for keys and queries alike, in both encoders (issue #16.4)."""

from __future__ import annotations

import pytest

from rapo_buffers.index import ENCODINGS, build_step_index
from rapo_buffers.retriever import InProcessRetriever
from rapo_buffers.schema import StepTrace, write_buffer
from rapo_buffers.text import MAX_CONTEXT_CHARS, normalize_context
from rapo_tools.search.faiss_index import IndexConfig, load_sidecar

# LaTeX costs about a token per character: this shared context is some 600 tokens in under 1,000 characters.
SHARED = r"Let $f(x)=\frac{x_{1}^{2}+x_{2}^{2}}{\sqrt{y_{3}}}$ and " * 18
ENDINGS = {
    "area": "Next we compute the area of the circle with radius 7.",
    "capital": "Next we look up which city is the capital of France.",
}


@pytest.mark.parametrize("mode", ["paper", "reference"])
def test_contexts_that_differ_only_at_the_end_are_told_apart(tmp_path, embedder, mode):
    traces = [
        StepTrace(key=SHARED + ending, value=f"<python>{name}()</python>", reward=1.0)
        for name, ending in ENDINGS.items()
    ]
    assert all(len(normalize_context(trace.key)) == len(trace.key) < MAX_CONTEXT_CHARS for trace in traces)
    assert all(len(embedder.model.tokenizer(trace.key)["input_ids"]) > 512 for trace in traces)
    corpus, index = tmp_path / "buffer.jsonl", tmp_path / "buffer.index"
    write_buffer(corpus, traces)
    build_step_index(traces, index, embedder, IndexConfig(kind="flat"), corpus, encoder=ENCODINGS[mode])
    assert load_sidecar(index)["encoder"]["truncation_side"] == "left"
    retriever = InProcessRetriever.from_files(corpus, index, embedder)
    for name, ending in ENDINGS.items():
        hits = retriever.retrieve([SHARED + ending], topk=2)[0]
        # Cut from the right, both keys and the query would be the same first tokens: a tie.
        assert hits[0].value == f"<python>{name}()</python>" and hits[0].score > hits[1].score + 1e-3


def test_an_index_records_its_encoder_and_queries_follow_it(tmp_path, embedder):
    traces = [StepTrace(key=SHARED + ending, value=name, reward=1.0) for name, ending in ENDINGS.items()]
    corpus, index = tmp_path / "buffer.jsonl", tmp_path / "buffer.index"
    write_buffer(corpus, traces)
    build_step_index(traces, index, embedder, IndexConfig(kind="flat"), corpus, encoder=ENCODINGS["reference"])
    assert load_sidecar(index)["encoder"] == {"pooling": "last_token", "max_length": 512, "truncation_side": "left",
                                              "position_ids": "own"}
    retriever = InProcessRetriever.from_files(corpus, index, embedder)  # a mean-pooling embedder is handed in
    assert retriever.embedder.encoder == ENCODINGS["reference"] and retriever.embedder.model is embedder.model
    assert retriever.retrieve([traces[0].key], topk=1)[0][0].score == pytest.approx(1.0, abs=1e-4)
