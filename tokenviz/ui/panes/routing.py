"""Routing view: in a mixture-of-experts model, the experts each MoE layer's router chose for the
token at the cursor, with their weights and the router's entropy; below, a strip per layer of the
top expert each recent token went to, and each expert's share of that stretch."""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from tokenviz.contract.records import LayerRoute
from tokenviz.contract.snapshot import Snapshot
from tokenviz.render.bars import bar
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane
from tokenviz.ui.selection import Selection

EXPERT_MARKS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a strip's cell: the top expert
LABEL = 6  # "L12  " before each row


def routes_at(snapshot: Snapshot, position: int) -> tuple[LayerRoute, ...] | None:
    """The routing of the token at `position` (the pass that fed it), if the model routed it."""
    records, n = snapshot.records, snapshot.prompt_len
    record = records[0] if position < n else (records[position - n + 1] if position - n + 1 < len(records) else None)
    if record is None or record.routing is None:
        return None
    return record.routing.at(position if position < n else -1)


class RoutingPane(RowsPane):
    TITLE = "routing"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        if not s.records or s.records[0].routing is None:
            dense = f"{selection.info.name} has no mixture-of-experts layers: every token goes through the same "
            self.body.set_class(True, "-note")  # a note wraps; the routing table does not
            self.body.update(Text(dense + "feed-forward network, so there is no routing to show."))
            return
        self.body.set_class(False, "-note")
        routes = routes_at(s, selection.cursor)
        width = max(self.size.width - 3, 30)
        text = Text(no_wrap=True, overflow="ellipsis")
        piece = visible(s.chips[selection.cursor].text) if selection.cursor < len(s.chips) else ""
        text.append(f"@{selection.cursor} {piece}: each MoE layer's experts for it\n", "bold")
        if routes is not None:
            self._chosen(text, routes, width)
        self._strip(text, s, selection.cursor, width)
        self.body.update(text)

    def _chosen(self, text: Text, routes: tuple[LayerRoute, ...], width: int) -> None:
        k = len(routes[0].experts)
        tail = 16 + (15 if routes[0].shared is not None else 0)  # " H 1.00 bits", "+ shared 0.51 "
        slot = max((width - LABEL - tail) // k, 12)  # "e12 ████ 0.62 " per expert
        bar_w = slot - 11
        for route in routes:
            text.append(f"L{route.layer:<{LABEL - 1}}", "bold")
            for expert, weight in zip(route.experts, route.weights):
                text.append(f"e{expert:<3}", "bold")
                text.append(bar(weight, bar_w), self.theme_colors.bar)
                text.append(f" {weight:4.2f} ")
            if route.shared is not None:
                text.append(f"+ shared {route.shared:4.2f} ", "bold")
            text.append(f" H {route.entropy:.2f} bits\n", "dim")

    def _strip(self, text: Text, s: Snapshot, cursor: int, width: int) -> None:
        """The recent tokens up to the cursor (as many as fit): each layer's top expert for each, and
        each expert's share of the top-k choices over them."""
        count = max(min(width - LABEL - 1, cursor + 1), 1)
        positions = range(cursor + 1 - count, cursor + 1)
        columns = [routes_at(s, p) for p in positions]
        kept = [c for c in columns if c is not None]
        if not kept:
            return
        text.append(f"\ntop expert per layer, last {len(kept)} tokens (0-9 a-z A-Z)\n", "bold")
        for j, first in enumerate(kept[0]):
            marks = "".join(EXPERT_MARKS[c[j].experts[0] % len(EXPERT_MARKS)] if c else " " for c in columns)
            shares = Counter(e for c in kept for e in c[j].experts)
            total = sum(shares.values())
            busiest = ", ".join(f"e{e} {n / total:.0%}" for e, n in shares.most_common(3))
            text.append(f"L{first.layer:<{LABEL - 1}}", "bold")
            text.append(marks)
            text.append(f"\n{'':<{LABEL}}busiest: {busiest}\n", "dim")
