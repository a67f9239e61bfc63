"""Embedder batching: length buckets cut padding, and a batch encodes exactly as its texts one at a time."""

from __future__ import annotations

import numpy as np
import pytest

from rapo_tools.search.embedding import length_buckets


def test_buckets_group_similar_lengths_and_cover_every_position_once():
    lengths = [40, 12, 11, 42, 10, 41, 13]
    groups = length_buckets(lengths, max_size=64, overhead=8)
    assert sorted(position for group in groups for position in group) == list(range(len(lengths)))
    assert [sorted(lengths[p] for p in group) for group in groups] == [[10, 11, 12, 13], [40, 41, 42]]


def test_buckets_respect_the_size_limit_and_trade_padding_for_calls():
    assert all(len(group) <= 3 for group in length_buckets([5] * 10, max_size=3, overhead=8))
    assert len(length_buckets([10, 20, 30], max_size=8, overhead=1000)) == 1  # calls too dear to split
    assert len(length_buckets([10, 20, 30], max_size=8, overhead=0)) == 3  # padding too dear to share


def test_a_batch_encodes_as_its_texts_one_at_a_time(embedder):
    texts = [
        "Which magazine was started first, Arthur's Magazine or First for Women?",
        "Oslo",
        "The Oberoi family is part of a hotel company that has a head office in what city?",
        "Oslo",  # a duplicate is encoded once and returned at both positions
        "Musician and satirist Allie Goertz wrote a song about the \"The Simpsons\" character Milhouse, "
        "who Matt Groening named after who?",
    ]
    batched = embedder.encode(texts)
    one_by_one = np.vstack([embedder.encode([text]) for text in texts])
    assert batched.shape == (5, embedder.dimension) and batched.flags["C_CONTIGUOUS"]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    assert np.array_equal(batched[1], batched[3])
