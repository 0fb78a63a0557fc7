"""Token pieces made visible: whitespace, newlines and control characters get a printable mark."""

from __future__ import annotations

_MARKS = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(text: str) -> str:
    """The piece with every invisible character shown (a space as ·, a newline as ↵, ...)."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in _MARKS:
            out.append(_MARKS[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"<0x{ord(ch):02X}>")
        else:
            out.append(ch)
    return "".join(out)
