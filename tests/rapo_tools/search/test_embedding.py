"""Embedder: length buckets cut padding, a batch encodes as its texts one at a time, and each `EncoderSpec` cuts,
pads and pools as it says (the reference encoder against an independent transformers encode)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rapo_tools.search.embedding import BUFFER_ENCODER, REFERENCE_BUFFER_ENCODER, EncoderSpec, length_buckets


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
        'Musician and satirist Allie Goertz wrote a song about the "The Simpsons" character Milhouse, '
        "who Matt Groening named after who?",
    ]
    batched = embedder.encode(texts)
    one_by_one = np.vstack([embedder.encode([text]) for text in texts])
    assert batched.shape == (5, embedder.dimension) and batched.flags["C_CONTIGUOUS"]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    assert np.array_equal(batched[1], batched[3])


def test_the_reference_encoder_ranks_like_an_independent_last_token_encode(hotpotqa_corpus, embedder, shared_data):
    """The reference's encoder, rebuilt from plain transformers: the last position's state, no pooling, 256 tokens,
    one text at a time (rapo's batches give each text the vector it has alone)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from rapo_env.tasks.hotpotqa import load_hotpotqa
    from rapo_tools.models import default_embedding_model
    from rapo_tools.search.corpus import iter_passages
    from rapo_tools.search.embedding import REFERENCE_SEARCH_ENCODER
    from rapo_tools.search.wiki_search import WikiSearch

    from .conftest import HOTPOTQA_QUESTIONS

    passages = list(itertools.islice(iter_passages(hotpotqa_corpus), 80))
    questions = [task.question for task in load_hotpotqa(shared_data / HOTPOTQA_QUESTIONS, limit=12)]
    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model(), padding_side="left")
    model = AutoModel.from_pretrained(default_embedding_model()).eval()

    def last_token(texts):
        with torch.no_grad():
            states = [
                model(**tokenizer(text, truncation=True, max_length=256, return_tensors="pt")).last_hidden_state[0, -1]
                for text in texts
            ]
        return torch.nn.functional.normalize(torch.stack(states), dim=-1).numpy()

    keys = last_token([passage.contents for passage in passages])  # the reference embeds the raw contents
    expected = np.argsort(-(last_token(questions) @ keys.T), axis=1)[:, :5]

    wiki = WikiSearch.from_passages(passages, embedder, encoder=REFERENCE_SEARCH_ENCODER, embed="contents")
    ranked = wiki.search(questions, topk=5)
    assert [[hit.row for hit in hits] for hits in ranked] == expected.tolist()
    assert wiki.index.reconstruct(0) == pytest.approx(keys[0], abs=1e-4)


@pytest.mark.parametrize("spec", [BUFFER_ENCODER, REFERENCE_BUFFER_ENCODER], ids=["paper", "reference"])
def test_context_encoders_keep_the_newest_tokens(embedder, spec):
    contexts = embedder.with_encoder(spec)
    middle = "rivers and mountains " * 200  # 600 tokens: more than either encoder keeps
    new, other = " finally compute the total price in dollars", " finally search for the capital of Peru"
    older_a, older_b = "apples and pears " * 50, "cars and trucks " * 50
    vectors = contexts.encode([older_a + middle + new, older_b + middle + new, older_a + middle + other])
    assert vectors[0] == pytest.approx(vectors[1], abs=1e-5)  # what differs was cut away
    assert float(vectors[0] @ vectors[2]) < 0.999  # what differs was kept
    documents = contexts.with_encoder(EncoderSpec(pooling=spec.pooling, max_length=spec.max_length))
    starts = documents.encode([older_a + middle + new, older_b + middle + new, older_a + middle + other])
    assert starts[0] == pytest.approx(starts[2], abs=1e-5) and float(starts[0] @ starts[1]) < 0.999  # right cut


def test_encoder_specs_reject_settings_that_mean_nothing():
    with pytest.raises(ValueError, match="pooling"):
        EncoderSpec(pooling="cls")
    with pytest.raises(ValueError, match="truncation_side"):
        EncoderSpec(truncation_side="middle")
    with pytest.raises(ValueError, match="max_length"):
        EncoderSpec(max_length=128)  # the model pipeline has its own length
    assert EncoderSpec.from_dict(None) == EncoderSpec() and EncoderSpec.from_dict({"pooling": "last_token"}).pooling
