"""Text that is safe to put on a terminal, whatever file or tokenizer it came from."""

from __future__ import annotations

KEPT = "\n\t"  # the only control characters kept (the panes show them as ↵ and ⇥)
# Bidirectional controls: they reorder the text after them on the terminal (a piece could show one
# thing and be another), so they are written out as the other controls are.
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _unsafe(ch: str) -> bool:
    code = ord(ch)
    return ch not in KEPT and (code < 32 or 127 <= code < 160 or ch in "\u2028\u2029" or ch in BIDI)


def safe_text(text: str) -> str:
    """`text` with every control character but newline and tab, and every bidirectional control,
    written as <0x..> (the form a byte piece already takes), so no escape sequence can reach the
    terminal and nothing reorders what it shows."""
    if not any(_unsafe(ch) for ch in text):
        return text
    return "".join(f"<0x{ord(ch):02X}>" if _unsafe(ch) else ch for ch in text)


def is_printable(text: str) -> bool:
    """What `safe_text` guarantees: no control character but newline and tab."""
    return not any(_unsafe(ch) for ch in text)


def shortened(text: str, most: int) -> str:
    """`text` in at most `most` characters, ending in "…" where it was cut."""
    return text if len(text) <= most else text[: most - 1] + "…"
