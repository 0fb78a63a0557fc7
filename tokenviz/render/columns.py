"""Fixed-width text cells: faster than a rich Table for panes redrawn every step."""

from __future__ import annotations

import re

from rich.cells import cell_len, set_cell_size


def cell(text: str, width: int, right: bool = False) -> str:
    """`text` padded to exactly `width` terminal cells (wide characters counted as two), or
    shortened with "…": a token piece cut short would read as another real token. `right` pads on
    the left."""
    if cell_len(text) > width:
        return set_cell_size(set_cell_size(text, max(width - 1, 0)) + "…", width) if width > 0 else ""
    if right:
        return " " * (width - cell_len(text)) + text
    return set_cell_size(text, width)


def fitting(variants: tuple[str, ...] | list[str], width: int) -> str:
    """The first of `variants` (longest and fullest first) that fits in `width` cells; else the
    last, shortened with "…" (see cell)."""
    for text in variants:
        if cell_len(text) <= width:
            return text
    return cell(variants[-1], width) if variants else ""


PHRASE_ENDS = ("; ", " · ", ", ", " (", ": ")  # where a line of prose is best cut
PHRASE_END = re.compile("|".join(re.escape(end) for end in PHRASE_ENDS))


def phrase_cut(text: str, width: int) -> str:
    """`text` whole where it fits in `width` cells; else cut where a phrase ends (PHRASE_ENDS), "…" after it,
    else at a space, else mid-word (cell): a status line cut mid-phrase read "…to safetensors once;"."""
    if cell_len(text) <= width:
        return text
    room = width - 1  # (the "…")
    ends = [m.start() for m in PHRASE_END.finditer(text) if m.start() > 0 and cell_len(text[: m.start()]) <= room]
    if ends:
        return text[: max(ends)].rstrip(" ;,:") + "…"
    spaces = [i for i, ch in enumerate(text) if ch == " " and i > 0 and cell_len(text[:i]) <= room]
    return text[: max(spaces)] + "…" if spaces else cell(text, width)
