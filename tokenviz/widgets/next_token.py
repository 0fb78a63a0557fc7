"""Next-token pane: the model's raw top-n with logits, probabilities and bars."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tokenviz.render.bars import bar
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
        bar_width = max(width - 38, 4)
        table = Table(box=None, padding=(0, 1), expand=True, show_edge=False, header_style="bold")
        for name, justify in (("#", "right"), ("token", "left"), ("id", "right"), ("logit", "right"),
                              ("prob", "right"), ("", "left")):
            table.add_column(name, justify=justify, no_wrap=True)
        shown = list(record.top[:rows])
        for rank, c in enumerate(shown, 1):
            mark = c.id == d.chosen_id
            style = f"bold {chosen_color}" if mark else ""
            table.add_row(("▶" if mark else "") + str(rank), Text(visible(c.text), style=style), str(c.id),
                          f"{c.logit:.2f}", f"{c.prob:.3f}", Text(bar(c.prob, bar_width), style=bar_color))
        if all(c.id != d.chosen_id for c in shown):
            table.add_row(f"▶{d.raw_rank}", Text(visible(d.chosen_text), style=f"bold {chosen_color}"),
                          str(d.chosen_id), "", f"{d.raw_prob:.3f}",
                          Text(bar(d.raw_prob, bar_width), style=bar_color))
        state = "pending" if view.is_pending else "taken"
        self.border_subtitle = f"entropy {record.entropy:.2f} bits · pos {record.position} · {state}"
        self.update(table)
