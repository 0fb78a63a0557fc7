"""Textual's footer, showing only the keys that fit whole: at 80 columns a key cut in half ("e prom")
reads as a key that does not exist. The keys keep their order (the most used first, as ui.keys lists
them), the command palette's stays at the right, and the rest are one ? or ctrl+p away."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

KEY_PADDING = 3  # a key's cells beyond its key and description: one space each side of the key, one after


def key_cells(key: FooterKey) -> int:
    return cell_len(key.key_display) + cell_len(key.description) + KEY_PADDING


class FittingFooter(Footer):
    def compose(self) -> ComposeResult:
        items: list[Widget] = list(super().compose())
        if not all(isinstance(item, FooterKey) for item in items):  # grouped keys: Textual's own layout
            yield from items
            return
        keys = [item for item in items if isinstance(item, FooterKey)]
        palette = [key for key in keys if key.has_class("-command-palette")]
        room = (self.size.width or self.app.size.width) - sum(key_cells(key) for key in palette)
        shown: list[FooterKey] = []
        for key in (key for key in keys if key not in palette):
            room -= key_cells(key)
            if room < 0:
                break
            shown.append(key)
        self.styles.grid_size_columns = len(shown)
        yield from shown
        yield from palette

    def on_resize(self) -> None:
        self.call_after_refresh(self.recompose)
