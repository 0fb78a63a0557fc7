"""Watch pane: the watched tokens over the journey, and why one rather than the other.

Each watched token's rank and raw and final probability at the cursor's step, and at every step on
one log scale shared by all (a token at p 5e-05 never looks like one at 0.3; the newest on the
right); for two watched tokens, their logit difference after the cursor split into the share of the
embeddings and of each layer's attention and MLP.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import SplitDifference
from tokenviz.contract.engine import Capability, refusal_of
from tokenviz.contract.results import LogitDifference
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell, fitting
from tokenviz.render.sparkline import LOG_FLOOR, log_sparkline
from tokenviz.render.units import probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane, Run, pending_note
from tokenviz.ui.selection import Selection


def current_difference(selection: Selection) -> LogitDifference | None:
    """The snapshot's split if it is of the two tokens watched last, after the cursor, else None."""
    s = selection.snapshot
    d = s.result(SplitDifference)
    if d is None or len(s.pinned) < 2 or d.position != selection.cursor:
        return None
    return d if (d.a_id, d.b_id) == (s.pinned[-2][0], s.pinned[-1][0]) else None


class WatchPane(RowsPane):
    TITLE = "watched tokens"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        text = Text(no_wrap=True, overflow="ellipsis")
        self.body.set_class(not s.pinned, "-note")  # a note wraps; the table does not
        if not s.pinned:
            text.append(
                "no token is watched: press w to choose one (a candidate, or type its text or id); two "
                "watched tokens also show why the model prefers one: their logit difference split by layer",
                Style(dim=True),
            )
            self.body.update(text)
            return
        width = max(self.size.width - 4, 30)  # the border and the scrollbar
        record = selection.record or s.records[-1]
        at = {p.id: p for p in record.decision.pinned}
        heading = f"at step {record.index} (the cursor's)  "
        text.append(heading, Style(bold=True))
        scale = (
            f"every step, the newest right, on one log scale for all: ▁ p {LOG_FLOOR:g} … █ p 1",
            f"one log scale for all: ▁ p {LOG_FLOOR:g} … █ p 1",
            f"▁ p {LOG_FLOOR:g} … █ p 1",
        )
        if cell_len(heading + scale[-1]) > width:  # the scale's key on a line of its own
            text.append("\n")
            heading = ""
        text.append(fitting(scale, width - len(heading)) + "\n", Style(dim=True))
        if n := selection.info.covers:  # an engine that returns its top N only (a server)
            giver = selection.info.giver
            text.append(
                fitting(
                    (
                        f"a token outside {giver}'s top {n} shows p 0 and rank >{n} (its probability is not returned)",
                        f"outside {giver}'s top {n}: p 0, rank >{n}",
                    ),
                    width,
                )
                + "\n",
                Style(dim=True),
            )
        narrow = width < 56  # the piece and its rank on a line of their own, the two rows under them
        indent = 2 if narrow else 19 + 11
        spark_w = max(width - indent - 15, 4)
        for token, piece in s.pinned:
            series = [next((p for p in r.decision.pinned if p.id == token), None) for r in s.records]
            raw = [p.prob if p else 0.0 for p in series]
            final = [p.final_prob if p else 0.0 for p in series]
            now = at.get(token)
            # The numbers before the sparkline: a narrow pane cuts the line's end, never its rank.
            label = cell(f"{visible(piece)} ({token})", 18)
            rank = f"rank {now.rank if now else '—':<6}"
            text.append(label + " ", Style(bold=True))
            text.append(rank + ("\n" + " " * indent if narrow else ""))
            text.append(f" raw   {probability(now.prob) if now else '—':>7} ")
            text.append(log_sparkline(raw, spark_w), Style(color=self.theme_colors.bar))
            text.append("\n" + " " * indent + " final ")
            text.append(f"{probability(now.final_prob) if now else '—':>7} ")
            text.append(log_sparkline(final, spark_w) + "\n", Style(color=self.theme_colors.bar_final))
        if len(s.pinned) >= 2:
            text.append("\n")
            self._split(text, selection, width)
        self.body.update(text)

    def _split(self, text: Text, selection: Selection, width: int) -> None:
        line = refusal_of(selection.info, Capability.LOGIT_SPLIT, "the split of their logit difference by layer")
        if line is not None:  # a runtime that cannot split it: its reason wrapped here (the view's lines do not)
            for part in Text(line, style=Style(dim=True)).wrap(self.app.console, width):
                text.append_text(part)
                text.append("\n")
            return
        d = current_difference(selection)
        if d is None:
            waiting = "splitting the logit difference after the cursor…"
            if selection.snapshot.playing:
                waiting = "the split is computed when autoplay pauses"
            text.append_text(
                pending_note(selection, waiting, "logit difference split", Run(SplitDifference, "view('watch')"))
            )
            return
        a, b = visible(d.a_text), visible(d.b_text)
        text.append(f"logit({a}) − logit({b}) = {d.total:+.3f} after position {d.position}", Style(bold=True))
        text.append(f"  ({'prefers ' + a if d.total >= 0 else 'prefers ' + b})\n")
        shares = (
            "each part's share, through the final norm as the forward pass scaled it (direct logit attribution)",
            "each part's share, through the final norm (direct logit attribution)",
            "each part's share (direct logit attribution)",
            "shares (direct logit attribution)",
            "each part's share",
        )
        text.append(fitting(shares, width) + "\n", Style(dim=True))
        top = max((abs(x) for x in (d.embedding, *d.attention, *d.mlp)), default=0.0) or 1.0
        bar_w = max((width - 34) // 2, 4)
        up, down = Style(color=self.theme_colors.bar), Style(color=self.theme_colors.bar_final)

        def share(value: float) -> None:
            text.append(f"{value:+8.3f} ")
            text.append(bar(abs(value) / top, bar_w), up if value >= 0 else down)

        text.append(f"{'':>10} {cell('attention', bar_w + 9)} MLP\n", Style(bold=True))
        text.append(f"{'embedding':>10} ")
        share(d.embedding)
        text.append("\n")
        for layer, (attention, mlp) in enumerate(zip(d.attention, d.mlp)):
            text.append(f"{'layer ' + str(layer):>10} ")
            share(attention)
            text.append(" ")
            share(mlp)
            text.append("\n")
        if width < 56:  # one figure a line, in the shares' column
            text.append(
                f"{'biases':>10} {d.bias:+8.3f}\n{'soft cap':>10} {d.softcap:+8.3f}\n{'sum':>10} {d.shares:+8.3f}"
            )
        else:
            text.append(f"{'biases':>10} {d.bias:+8.3f}   soft cap {d.softcap:+.3f}   sum {d.shares:+.3f}")
