"""A token's piece is the same decoded alone or among thousands at once (a prefill's candidates)."""

import pytest
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner


def same_pieces(loaded, ids):
    one_by_one = ModelRunner(loaded)
    alone = [one_by_one.piece(i) for i in ids]
    runner = ModelRunner(loaded)
    runner.learn_pieces(ids)
    assert len(runner.pieces.known) == len(set(ids))  # decoded in the one call
    assert [runner.piece(i) for i in ids] == alone


def test_pieces_learnt_at_once_equal_pieces_one_by_one():
    loaded = tiny_model("llama")
    same_pieces(loaded, list(range(len(loaded.tokenizer))) * 2)


@pytest.mark.bundled
def test_the_bundled_vocabulary_learnt_at_once_equals_it_one_by_one(bundled):
    same_pieces(bundled, list(range(len(bundled.tokenizer))))
