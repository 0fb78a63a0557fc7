"""Which tokens of a conversation its chat template added: what a backend without the text's offsets
(a server's /tokenize, llama.cpp's tokenizer) marks, by finding each message's own tokens in the ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def template_marks(ids: Sequence[int], contents: Sequence[str], encode: Callable[[str], list[int]]) -> list[bool]:
    """Per token of `ids`: True where the template added it, False inside a message's own words (each
    of `contents` encoded alone by `encode`, found where it first occurs; one not found stays marked)."""
    marks = [True] * len(ids)
    for words in contents:
        own = encode(words) if words else []
        at = find(ids, own)
        if at is not None:
            marks[at : at + len(own)] = [False] * len(own)
    return marks


def find(ids: Sequence[int], part: Sequence[int]) -> int | None:
    """Where `part` first occurs in `ids` (None: nowhere, or empty)."""
    n = len(part)
    return next((i for i in range(len(ids) - n + 1) if n and list(ids[i : i + n]) == list(part)), None)
