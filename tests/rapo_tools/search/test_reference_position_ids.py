"""``EncoderSpec(position_ids="reference")``: the authors' padded positions, for reusing an index their code built.

The authors' last-token encoder lets the transformer count positions from the batch's first column, pads
included, so a short text batched with a long one gets another vector than it has alone. rapo's default
(``own``) gives every text its own vector; ``reference`` reproduces theirs, batch by batch in the order given.
"""

import numpy as np
import pytest

from rapo_tools.search.embedding import EncoderSpec

SHORT = "Paris."
LONG = "Oslo is the capital of Norway and its largest city, on the Oslofjord in the south of the country."


def authors_batch(embedder, texts):
    """The authors' encode of one batch: left padding, default positions, the last state, normalised."""
    import torch

    model = embedder.model[0].auto_model
    inputs = embedder.model.tokenizer(texts, padding=True, padding_side="left", truncation=True, max_length=256,
                                      return_tensors="pt")
    with torch.no_grad():
        states = model(**{key: value.to(model.device) for key, value in inputs.items()}).last_hidden_state[:, -1]
    return torch.nn.functional.normalize(states.float(), dim=-1).cpu().numpy()


def test_reference_positions_give_the_authors_batched_vectors(embedder):
    spec = EncoderSpec(pooling="last_token", max_length=256, position_ids="reference")
    view = embedder.with_encoder(spec)  # a view: its batch size is its own
    view.batch_size = 2
    vectors = view.encode([SHORT, LONG])
    np.testing.assert_allclose(vectors, authors_batch(embedder, [SHORT, LONG]), atol=1e-5)
    own = embedder.with_encoder(EncoderSpec(pooling="last_token", max_length=256)).encode([SHORT, LONG])
    assert float(own[0] @ vectors[0]) < 0.999  # the padded short text is not the text alone


def test_reference_positions_need_last_token_pooling():
    with pytest.raises(ValueError, match="needs pooling='last_token'"):
        EncoderSpec(position_ids="reference")
    with pytest.raises(ValueError, match="position_ids must be one of"):
        EncoderSpec(pooling="last_token", position_ids="batch")
