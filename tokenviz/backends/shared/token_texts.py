"""The text each token adds, decoded once per id and kept: what every view and record shows.

Its own object, apart from the runner, so that records which decode their pieces when read (a
prefill's predictions) hold the tokenizer and not the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, cast

from tokenviz.contract.text import safe_text


class TokenPieces:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, str] = {}  # by id: at most the vocabulary

    def piece(self, token_id: int) -> str:
        """The exact text a token adds, safe to print. Byte pieces that are not whole characters, and
        control characters but newline and tab, show as <0x..>."""
        known = self.known.get(token_id)
        if known is None:
            known = self.known[token_id] = self._piece(token_id, self.decode([token_id]))
        return known

    def learn(self, ids: Iterable[int]) -> None:
        """Decode the pieces of `ids` not known yet in one call to the tokenizer's Rust backend
        (where it has the plain one): a 2048-token prefill's ten thousand candidates then cost
        about 20 ms on a CPU, not 100-150 ms one by one."""
        new = [i for i in dict.fromkeys(ids) if i not in self.known]
        if len(new) < 2:
            return
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if getattr(type(self.tokenizer), "_decode", None) is not _plain_decode() or backend is None:
            return  # a tokenizer of its own decoding: one by one, as piece() does
        for token_id, text in zip(new, backend.decode_batch([[i] for i in new], skip_special_tokens=False)):
            self.known[token_id] = self._piece(token_id, text)

    def decode(self, ids: Iterable[int]) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return cast(str, text)  # a list of ids decodes to one string

    def _piece(self, token_id: int, text: str) -> str:
        if "\ufffd" in text:
            raw = str(self.tokenizer.convert_ids_to_tokens(token_id))
            if raw and "\ufffd" not in raw:
                return safe_text(_byte_piece(raw))
        return safe_text(text)


@lru_cache(maxsize=1)
def _plain_decode() -> Callable[..., str] | None:
    """The fast tokenizers' decode: their Rust backend's, no more."""
    from transformers import PreTrainedTokenizerFast

    return getattr(PreTrainedTokenizerFast, "_decode", None)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {v: k for k, v in bytes_to_unicode().items()}


def _byte_piece(raw: str) -> str:
    """Show a byte-level BPE piece that is part of a multi-byte character as its bytes."""
    decoder = _byte_decoder()
    if all(ch in decoder for ch in raw):
        data = bytes(decoder[ch] for ch in raw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in data)
    return raw
