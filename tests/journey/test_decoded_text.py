"""A journey's text decoded as it grows (journey.decoded_text) is exactly the whole path decoded at once,
for the kinds of decoder tokenizers have (byte-level BPE, SentencePiece's byte fallback and leading
space, Metaspace, WordPiece's joins and clean-up), with characters whose bytes are split over tokens,
rewinds and branches; and it decodes a window of the newest tokens, not the whole path."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import CORPUS, tiny_tokenizer
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenviz.journey.decoded_text import ADVANCE, CONTEXT, DecodedText

TEXTS = [*CORPUS, "Ünïcödé façade, naïve café: 東京 and 🙂 emoji.", "##sub words, and . spaces before , marks"]


def _byte_fallback() -> PreTrainedTokenizerFast:
    """SentencePiece as Llama's tokenizer.json has it: a leading ▁, byte tokens for what the vocabulary
    lacks, and a decoder that strips the first space."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(TEXTS[:4] * 4, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"]))
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    llama = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    llama.normalizer = tok.normalizer
    llama.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=llama)


def _metaspace() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        TEXTS * 4, trainers.UnigramTrainer(vocab_size=150, special_tokens=["<unk>"], unk_token="<unk>")
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(TEXTS * 4, trainers.WordPieceTrainer(vocab_size=150, special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@cache
def tokenizer(kind: str) -> PreTrainedTokenizerFast:
    return {
        "byte-level": tiny_tokenizer,
        "byte-fallback": _byte_fallback,
        "metaspace": _metaspace,
        "wordpiece": _wordpiece,
    }[kind]()


KINDS = ["byte-level", "byte-fallback", "metaspace", "wordpiece"]


def whole(kind: str):
    tok = tokenizer(kind)
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("kind", KINDS)
def test_a_growing_path_is_decoded_as_a_whole_one_at_every_step(kind):
    decode = whole(kind)
    tok = tokenizer(kind)
    ids = [t for text in TEXTS for t in tok.encode(text, add_special_tokens=False)] * 3
    if kind == "byte-fallback":  # a character's bytes split over tokens, at some steps not yet whole
        assert any(tok.convert_ids_to_tokens(t).startswith("<0x") for t in ids)
    text = DecodedText(decode)
    for n in range(len(ids) + 1):
        assert text.of(ids[:n]) == decode(ids[:n]), n


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_path_with_rewinds_and_branches_is_decoded_as_a_whole_one(kind, data):
    decode = whole(kind)
    vocab = len(tokenizer(kind))
    text, ids = DecodedText(decode), []
    moves = data.draw(
        st.lists(
            st.one_of(
                st.lists(st.integers(0, vocab - 1), min_size=1, max_size=ADVANCE + 10),  # tokens taken
                st.integers(1, 40),  # a rewind
            ),
            max_size=12,
        )
    )
    for move in moves:
        ids = ids[: max(len(ids) - move, 0)] if isinstance(move, int) else ids + move
        assert text.of(ids) == decode(ids)


def test_a_long_path_decodes_a_window_not_the_path():
    """Cost grows with the window, not with the journey's length."""
    decode, lengths = whole("byte-level"), []
    text = DecodedText(lambda ids: lengths.append(len(ids)) or decode(ids))
    ids = [t for t in tokenizer("byte-level").encode(" ".join(TEXTS * 20), add_special_tokens=False)]
    assert len(ids) > 20 * ADVANCE
    for n in range(1, len(ids) + 1):
        text.of(ids[:n])
    assert max(lengths) <= ADVANCE + CONTEXT + 4  # (+ a character's bytes over tokens: the anchor waits for it whole)
    assert text.of(ids) == decode(ids)


def test_the_same_path_asked_again_is_not_decoded_again():
    """A frame with no new token (a message, a setting changed) asks the decoder nothing: a served
    model's decode is a request to its server."""
    decode, calls = whole("byte-level"), []
    text = DecodedText(lambda ids: calls.append(list(ids)) or decode(ids))
    ids = tokenizer("byte-level").encode(" ".join(TEXTS), add_special_tokens=False)
    first = text.of(ids[:5])
    asked = len(calls)
    assert asked >= 1 and text.of(list(ids[:5])) == first and len(calls) == asked
    assert text.of(ids[:6]) == decode(ids[:6]) and len(calls) > asked  # (a new token: decoded)
    assert text.of(ids[:5]) == first  # (a rewind: the text of that path again)


def test_a_decoder_that_is_not_windowed_decodes_the_whole_path():
    """A decoder whose text of a window does not begin with its first tokens' own text is not windowed."""
    decode = whole("byte-level")
    numbered = lambda ids: f"{len(ids)}:" + decode(ids)  # noqa: E731  (each decode's text begins with its length)
    text = DecodedText(numbered)
    ids = tokenizer("byte-level").encode(" ".join(TEXTS * 3), add_special_tokens=False)
    for n in range(len(ids) + 1):
        assert text.of(ids[:n]) == numbered(ids[:n])


@pytest.mark.bundled
def test_the_bundled_tokenizer_decodes_a_journey_as_a_whole(bundled):
    tok = bundled.tokenizer
    decode = lambda ids: tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    ids = tok.encode(" ".join(TEXTS) * 2) + list(range(0, 49152, 997))
    text = DecodedText(decode)
    for n in range(len(ids) + 1):
        assert text.of(ids[:n]) == decode(ids[:n])
