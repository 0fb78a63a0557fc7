"""Next-token pane: the model's raw top-n with logits, probabilities and bars."""

from __future__ import annotations

from rich.text import Text

from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.pieces import visible
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.selection import Selection


class NextTokenPane(BoxPane):
    TITLE = "next token"

    def draw(self, selection: Selection) -> None:
        record = selection.record
        if record is None:
            self.border_subtitle = ""
            self.update(
                Text(
                    f"The model predicts only after the last prompt token; position {selection.cursor} "
                    "is inside the prompt (move the cursor right).",
                    style="dim",
                )
            )
            return
        d = record.decision
        chosen_color = self.colors.chosen
        bar_color = self.colors.bar
        rows = max(self.size.height - 1, 3)
        width = max(self.size.width, 24)
        show_logit = width >= 46  # narrow panes drop the logit column first
        piece_w = min(16, max(6, width - 40 if show_logit else width - 32))
        fixed = 5 + piece_w + 7 + (8 if show_logit else 0) + 7 + 1
        bar_width = max(width - fixed, 2)
        text = Text(no_wrap=True, overflow="crop")
        header = f"{'#':>4} {cell('token', piece_w)} {'id':>6}" + (f" {'logit':>7}" if show_logit else "")
        text.append(header + f" {'prob':>6}\n", style="bold")

        def row(rank: int, piece: str, token_id: int, logit: str, prob: float, mark: bool) -> None:
            style = f"bold {chosen_color}" if mark else ""
            text.append(f"{('▶' if mark else '') + str(rank):>4} ", style=style)
            text.append(cell(visible(piece), piece_w), style=style)
            text.append(f" {token_id:>6}" + (f" {logit:>7}" if show_logit else "") + f" {prob:>6.3f} ")
            text.append(bar(prob, bar_width) + "\n", style=bar_color)

        shown = list(record.top[:rows])
        for rank, c in enumerate(shown, 1):
            row(rank, c.text, c.id, f"{c.logit:.2f}", c.prob, c.id == d.chosen_id)
        if all(c.id != d.chosen_id for c in shown):
            row(d.raw_rank, d.chosen_text, d.chosen_id, "", d.raw_prob, True)
        text.rstrip()
        state = "pending" if selection.is_pending else "taken"
        self.border_subtitle = f"entropy {record.entropy:.2f} bits · pos {record.position} · {state}"
        self.update(text)
