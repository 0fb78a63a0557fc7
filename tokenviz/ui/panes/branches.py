"""Branch tree pane: every path taken from the prompt, and two of them side by side."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tokenviz.contract.commands import SwitchBranch
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection


class BranchPane(ScrollPane):
    TITLE = "branches"

    selected = 1  # index into the summaries (0 is the current path)

    def action_select_branch(self, delta: int) -> None:
        self.selected += delta
        self.journey.open_view("branches")

    def action_open_branch(self) -> None:
        """Switch to the selected branch; with the branches not shown, show them first (no switch unseen)."""
        journey = self.journey
        s = journey.snapshot
        if s is None or len(s.branches) < 2:
            self.notify("there is no other branch yet", severity="warning")
            return
        if journey.current_view != "branches":
            journey.open_view("branches")
            self.notify("the branches: < and > select one, o switches to it")
            return
        target = s.branches[min(max(self.selected, 1), len(s.branches) - 1)]
        journey.cursor = None
        journey.submit(SwitchBranch(index=target.index))

    def draw(self, selection: Selection) -> None:
        body = self.body
        summaries = selection.snapshot.branches
        chosen = self.theme_colors.chosen
        cursor = self.theme_colors.chip_cursor
        if len(summaries) < 2:
            body.update(
                Text(
                    "one path so far. Rewind (backspace) and step differently, or move the cursor onto an "
                    "earlier token and press 2-9 to take another token there: the old path stays here as "
                    "a branch.",
                    style="dim",
                )
            )
            return
        self.selected = min(max(self.selected, 1), len(summaries) - 1)
        listing = Text()  # wrapped to the pane: no figure is cut
        # a server keeps its own cache: the path's tokens go with the next request
        rebuilt = (
            "its tokens go with the next request"
            if selection.info.requests
            else "the cache is rebuilt from the shared prefix"
        )
        listing.append(f"< and > select, o switches to the selected branch ({rebuilt})\n", style="dim")
        for i, b in enumerate(summaries):
            mark = "●" if b.current else ("▶" if i == self.selected else " ")
            style = f"bold {chosen}" if b.current else (f"bold {cursor}" if i == self.selected else "")
            label = "current" if b.current else f"branch {i}"
            # how far it runs with the current path, in generated tokens as its own count (b.shared counts
            # positions, the prompt's included)
            together = max(b.shared - selection.snapshot.prompt_len, 0)
            shared = "" if b.current else f"its first {together} generated as current's · "
            listing.append(
                f"{mark} {label:<9} {b.tokens:>3} generated · log-prob {b.logprob:8.2f} · "
                f"entropy {b.mean_entropy:4.2f} bits · {shared}",
                style=style,
            )
            listing.append(visible(b.text, spaces=False) + "\n", style=style)  # (spaces kept: it wraps at words)
        current, other = summaries[0], summaries[self.selected]
        table = Table(expand=True, show_edge=False, header_style="bold", padding=(0, 1))
        table.add_column("current path")
        table.add_column(f"branch {self.selected}")
        table.add_row(
            *(
                Text(f"log-prob {b.logprob:.2f} · {b.tokens} tokens · mean entropy {b.mean_entropy:.2f} bits")
                for b in (current, other)
            )
        )
        table.add_row(*(Text(b.text) for b in (current, other)))
        part = other.shared - 1
        self.set_subtitle(
            f"{len(summaries)} paths · they part after position {part}",
            f"{len(summaries)} paths · part after {part}",
            f"part after {part}",
        )
        body.update(Group(listing, table))
