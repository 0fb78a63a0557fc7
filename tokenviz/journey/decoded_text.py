"""A journey's text decoded as it grows: each time only a window of the newest tokens, and exactly the
text that decoding the whole path at once gives.

Decoding the whole path at every frame costs what the path's length does (the bundled model's tokenizer:
0.6 ms at 2,000 tokens, 2.2 ms at 8,000; a frame needs the text twice, and a step once more for its stop
strings). As the streaming decoders of vLLM and tokenizers' DecodeStream do, the text before an anchor
is kept, and a window from a few tokens before the anchor is decoded: what a decoder does to a
decode's first tokens (a leading space stripped, a WordPiece join) happens alike to the window and to
the same few tokens alone, and their text is cut from the window's. The anchor moves on only where the
text is whole (it does not end inside a character whose bytes are split over tokens). A decoder that
breaks this (the window's text does not begin with the few tokens' own) has every path decoded whole, as
before; a rewind or a branch behind the anchor decodes the path whole once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

CONTEXT = 4  # tokens before the anchor decoded with the window (vLLM's streaming decoder takes 5)
ADVANCE = 32  # tokens past the anchor before it moves on: the window decoded is at most about this long
REPLACEMENT = "\ufffd"  # what a decoder gives for the bytes of a character not yet whole


class DecodedText:
    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._kept: list[int] = []  # the path up to the anchor
        self._text = ""  # its text
        self._head = ""  # the text of its last CONTEXT tokens, decoded alone
        self._local = True  # False: this decoder's text is not windowed (see the module's docstring)
        self._last: tuple[list[int], str] | None = None  # the path asked last and its text: a frame with
        # no new token asks nothing again (a served model's decode is a request)

    def of(self, ids: list[int]) -> str:
        """`ids` decoded: the same text as decoding them all at once."""
        last = self._last
        if last is not None and ids == last[0]:
            return last[1]
        text = self._decoded(ids)
        self._last = (list(ids), text)
        return text

    def _decoded(self, ids: list[int]) -> str:
        if not self._local:
            return self._decode(ids)
        anchor = len(self._kept)
        if len(ids) < anchor or ids[:anchor] != self._kept:
            self._kept, self._text, self._head, anchor = [], "", "", 0
        window = self._decode(ids[max(anchor - CONTEXT, 0) :])
        if not window.startswith(self._head):
            self._local = False
            return self._decode(ids)
        text = self._text + window[len(self._head) :]
        if len(ids) - anchor >= ADVANCE and not text.endswith(REPLACEMENT):
            self._kept, self._text = list(ids), text
            self._head = self._decode(ids[-CONTEXT:])
        return text
