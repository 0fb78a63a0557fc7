"""Next-token pane: the model's raw top-n with logits, probabilities and bars."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.pieces import visible
from tokenviz.widgets.view import View, theme_var


class NextTokenPane(Static):
    DEFAULT_CSS = "NextTokenPane { border: round $panel-lighten-2; border-title-color: $primary; }"

    def on_mount(self) -> None:
        self.border_title = "next token"

    def show(self, view: View) -> None:
        record = view.record
        if record is None:
            self.border_subtitle = ""
            self.update(Text(f"The model predicts only after the last prompt token; position {view.cursor} "
                             "is inside the prompt (move the cursor right).", style="dim"))
            return
        d = record.chosen
        chosen_color = theme_var(self.app, "chosen-color", "green")
        bar_color = theme_var(self.app, "bar-color", "blue")
        rows = max(self.size.height - 4, 3)
        width = max(self.size.width - 4, 30)
        piece_w = 12 if width < 50 else 16
        bar_width = max(width - piece_w - 29, 4)
        text = Text(no_wrap=True, overflow="crop")
        text.append(f"{'#':>4} {cell('token', piece_w)} {'id':>6} {'logit':>7} {'prob':>6}\n", style="bold")

        def row(rank: int, piece: str, token_id: int, logit: str, prob: float, mark: bool) -> None:
            style = f"bold {chosen_color}" if mark else ""
            text.append(f"{('▶' if mark else '') + str(rank):>4} ", style=style)
            text.append(cell(visible(piece), piece_w), style=style)
            text.append(f" {token_id:>6} {logit:>7} {prob:>6.3f} ")
            text.append(bar(prob, bar_width) + "\n", style=bar_color)

        shown = list(record.top[:rows])
        for rank, c in enumerate(shown, 1):
            row(rank, c.text, c.id, f"{c.logit:.2f}", c.prob, c.id == d.chosen_id)
        if all(c.id != d.chosen_id for c in shown):
            row(d.raw_rank, d.chosen_text, d.chosen_id, "", d.raw_prob, True)
        text.rstrip()
        state = "pending" if view.is_pending else "taken"
        self.border_subtitle = f"entropy {record.entropy:.2f} bits · pos {record.position} · {state}"
        self.update(text)
