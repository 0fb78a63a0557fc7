"""Embedding and position pane: the token's embedding row, the position scheme, and how the
residual stream's norm grows layer by layer."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from tokenviz.contract.results import lens_row_label
from tokenviz.render.bars import bar
from tokenviz.render.colors import ramp
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.panes.lens import inspection_or_note
from tokenviz.ui.selection import Selection


class EmbeddingPane(ScrollPane):
    TITLE = "embedding & position"

    def draw(self, selection: Selection) -> None:
        body = self.body
        waiting = "reading the embedding and residual stream for this position…"
        inspection = inspection_or_note(selection, body, waiting, "embedding")
        if inspection is None:
            return
        i = inspection
        colors = ramp(list(self.theme_colors.heatmap_stops), 32)
        bar_color = self.theme_colors.bar
        text = Text(no_wrap=True, overflow="crop")
        text.append(f"token {visible(i.token_text)} id {i.token_id} at position {i.position}\n", style="bold")
        text.append(f"embedding row {i.token_id} (first {len(i.embedding_head)} dims, norm {i.embedding_norm:.3f}):\n")
        scale = max(abs(v) for v in i.embedding_head) or 1.0
        for v in i.embedding_head:  # diverging strip: low = negative, high = positive
            text.append("█", Style(color=colors[round((v / scale + 1) / 2 * (len(colors) - 1))]))
        text.append("\n" + " ".join(f"{v:+.3f}" for v in i.embedding_head[:8]) + " …\n")
        text.append(f"positions: {i.positions}")
        text.append(
            " (added to the embedding)\n"
            if i.positions.startswith("learned")
            else " (rotates queries and keys inside attention)\n"
        )
        text.append(
            "input and output embeddings are tied: the same matrix reads tokens in and scores them out\n"
            if i.tied_embeddings
            else "input and output embeddings are separate matrices\n"
        )
        text.append("\nresidual stream norm after each layer:\n", style="bold")
        top = max(row.residual_norm for row in i.lens) or 1.0
        width = max(self.size.width - 18, 8)
        for row in i.lens:
            label = lens_row_label(row.layer)
            text.append(f"{label:>4} {row.residual_norm:>9.2f} ")
            text.append(bar(row.residual_norm / top, width) + "\n", style=bar_color)
        text.rstrip()
        body.update(text)
