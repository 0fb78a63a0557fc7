"""Logit lens pane: what each layer would predict if the model stopped there."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import Static

from tokenviz.contract.commands import Inspect
from tokenviz.contract.lens_layers import spread
from tokenviz.contract.results import Inspection, LensLayer, first_top1, lens_row_label
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane, Run, result_or_note
from tokenviz.ui.selection import Selection


def current_inspection(selection: Selection) -> Inspection | None:
    """The snapshot's inspection if it belongs to the cursor's position of this journey, else None."""
    s = selection.snapshot
    inspection = s.result(Inspect)
    if inspection is None or inspection.position != selection.cursor or selection.cursor >= len(s.chips):
        return None
    if inspection.token_id != s.chips[selection.cursor].id or inspection.chosen_id != selection.following_id:
        return None
    return inspection


def inspection_or_note(selection: Selection, body: Static, waiting: str, view: str) -> Inspection | None:
    """The cursor's inspection; or, while there is none, a note in `body` saying why (`view`: the view
    whose key asks for it again)."""
    run = Run(Inspect, f"view('{view}')")
    return result_or_note(current_inspection(selection), selection, body, waiting, "residual stream", run)


def every_lens_row(selection: Selection) -> tuple[int, ...]:
    """Every row the journey's lens may show: the rows chosen (--lens-layers), else every layer's."""
    return selection.snapshot.lens_rows or tuple(range(selection.info.layers + 1))


def lens_rows_shown(selection: Selection, room: int) -> tuple[int, ...]:
    """The lens rows a view of `room` lines shows: the rows chosen (--lens-layers) all, scrolled; else
    every layer's where they fit, or as many as fit spread over the model's depth (the lens is computed
    for those alone: its cost follows the screen); none before the view has a size."""
    if selection.snapshot.lens_rows is not None:
        return selection.snapshot.lens_rows
    return spread(every_lens_row(selection), max(room, 0))


class LensPane(RowsPane):
    TITLE = "logit lens"
    HEADER_LINES = 2  # the position's line and the columns' names, above the rows

    class Resized(Message):
        """The pane can show more rows or fewer now: the screen asks the worker again."""

    def on_resize(self) -> None:
        super().on_resize()
        self.post_message(self.Resized())

    def rows_room(self) -> int:
        """How many lens rows fit the pane without scrolling (at least the embeddings and the last layer,
        scrolled, in a pane too short for them; none before it has a size)."""
        return max(self.size.height - self.HEADER_LINES, 2) if self.size.height else 0

    def draw(self, selection: Selection) -> None:
        body = self.body
        inspection = inspection_or_note(selection, body, "computing the lens for this position…", "lens")
        if inspection is None:
            return
        wanted = lens_rows_shown(selection, self.rows_room())
        rows: tuple[LensLayer, ...] = inspection.lens
        spread_shown = bool(wanted) and inspection.holds(wanted)
        if spread_shown:
            rows = inspection.rows_of(wanted)
        some = len(rows) < selection.info.layers + 1 and selection.snapshot.lens_rows is None
        chosen_color = self.theme_colors.chosen
        bar_color = self.theme_colors.bar
        first = first_top1(rows)
        width = max(self.size.width - 2, 30)
        piece_w = 9 if width < 90 else 12
        n_top = max(1, min(3, (width - 24) // (piece_w + 7)))  # narrow panes show fewer guesses per layer
        watched = inspection.pinned
        watch_w = 13  # " rank p.ppp" under the watched token's piece
        bar_w = max(width - n_top * (piece_w + 7) - 20 - watch_w * len(watched), 0)
        text = Text(no_wrap=True, overflow="ellipsis")
        chosen_text = visible(chosen_text_of(selection, inspection))
        text.append(f"@{inspection.position} {visible(inspection.token_text)} → {chosen_text}: ", style="bold")
        text.append(
            f"top-1 from {lens_row_label(first)}" if first is not None else "never settles as top-1",
            style=f"bold {chosen_color}",
        )
        if some and first is not None:
            text.append(f" (of {len(rows)} shown)", style=chosen_color)
        text.append(
            "\n" + f"{'layer':>5} {cell(f'top {n_top}', n_top * (piece_w + 7))}"
            f" {'rank':>5} {'p(next)':>7}"
            + "".join(" " + cell(f"★{visible(piece)}", watch_w - 1, right=True) for _, piece in watched)
            + "\n",
            style="bold",
        )
        for row in rows:
            label = lens_row_label(row.layer)
            style = f"bold {chosen_color}" if first is not None and row.layer == first else ""
            text.append(f"{'★' if style else ' '}{label:>4} ", style=style)
            for token_id, piece, prob in row.top[:n_top]:
                mark = token_id == inspection.chosen_id
                text.append(cell(visible(piece), piece_w), style=f"bold {chosen_color}" if mark else "")
                text.append(f" {prob:5.3f} ")
            text.append(f"{row.chosen_rank:>5} {row.chosen_prob:>7.4f} ")
            for rank, prob in row.pinned:
                text.append(f"{rank:>6} {prob:5.3f} ", style=self.theme_colors.bar_final)
            text.append(bar(row.chosen_prob, bar_w) + "\n", style=bar_color)
        text.rstrip()
        through = "each layer through the final norm + unembedding"  # the last row: the model's own
        if some:
            spaced = f"{len(rows)} of {selection.info.layers + 1} layers" + (
                ", spread: a taller pane shows more" if spread_shown else ""
            )
            self.set_subtitle(f"{spaced} · {through}", spaced, f"{len(rows)} of {selection.info.layers + 1}")
        else:
            self.set_subtitle(through, "through the final norm + unembedding")
        body.update(text)


def chosen_text_of(selection: Selection, inspection: Inspection) -> str:
    s = selection.snapshot
    return next((c.text for c in s.chips if c.id == inspection.chosen_id), None) or (
        s.pending.decision.chosen_text if s.pending else str(inspection.chosen_id)
    )
