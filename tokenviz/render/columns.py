"""Fixed-width text cells: faster than a rich Table for panes redrawn every step."""

from __future__ import annotations

from rich.cells import set_cell_size


def cell(text: str, width: int, right: bool = False) -> str:
    """`text` cut or padded to exactly `width` terminal cells (wide characters counted as two)."""
    if right:
        return set_cell_size(text[::-1], width)[::-1] if len(text) <= width else set_cell_size(text, width)
    return set_cell_size(text, width)
