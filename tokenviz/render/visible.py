"""Token pieces made visible: whitespace, newlines and control characters get a printable mark."""

from __future__ import annotations

import re
from collections.abc import Sequence

_BYTES = re.compile(r"(?:<0x[0-9A-F]{2}>)+")
MAX_CHAR_BYTES = 4  # a UTF-8 character is at most 4 bytes, so at most 4 byte pieces
_MARKS = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(text: str, spaces: bool = True) -> str:
    """The piece with every invisible character shown (a space as ·, a newline as ↵, ...); with
    `spaces` False a space stays a space (a name on one line, not a token's piece)."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch == " " and not spaces:
            out.append(ch)
        elif ch in _MARKS:
            out.append(_MARKS[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"<0x{ord(ch):02X}>")
        else:
            out.append(ch)
    return "".join(out)


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a byte piece (`<0xE2><0x82>`) stands for; None for any other piece."""
    if not _BYTES.fullmatch(piece):
        return None
    return bytes(int(piece[k + 3 : k + 5], 16) for k in range(0, len(piece), 6))


def spelled(pieces: Sequence[str], i: int) -> str:
    """The character that byte piece `i` completes together with the byte pieces just before it
    (`<0xE2>` `<0x82>` `<0xAC>` spell €), or "" when it completes none. Only the pieces up to `i`
    decide, so a piece's label never changes when more tokens come."""
    data = b""
    for j in range(i, max(i - MAX_CHAR_BYTES, -1), -1):
        piece = piece_bytes(pieces[j])
        if piece is None:
            return ""
        data = piece + data
        if data[0] >= 0xC0:  # a lead byte: the character starts here
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return ""
            return text if text.isprintable() else ""
    return ""
