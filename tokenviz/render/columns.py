"""Fixed-width text cells: faster than a rich Table for panes redrawn every step."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size


def cell(text: str, width: int, right: bool = False) -> str:
    """`text` cut or padded to exactly `width` terminal cells (wide characters counted as two);
    `right` pads on the left."""
    if right and cell_len(text) < width:
        return " " * (width - cell_len(text)) + text
    return set_cell_size(text, width)
