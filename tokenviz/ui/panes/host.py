"""What a pane's own actions reach of the journey's screen (ui.journey_screen.JourneyScreen): the journey
on screen, the layer, head and cursor it shows, and the commands it sends. The screen routes a pane's
keys to the pane (see ui.keys.Press.owner); the pane acts through this, never the screen's class."""

from __future__ import annotations

from typing import Any, Protocol

from tokenviz.contract.attention import Head
from tokenviz.contract.commands import Command, Request
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.worker import Worker
from tokenviz.ui.selection import Selection


class JourneyHost(Protocol):
    snapshot: Snapshot | None
    cursor: int | None  # the token position chosen; None: the newest
    model_layer: int  # the layer the attention map shows (0-based)
    head: Head
    worker: Worker[Snapshot]

    @property
    def current_view(self) -> str | None:
        """The view where the attention map is (its widget id: "attention" for the map itself)."""

    def submit(self, command: Command) -> None: ...

    def current_selection(self) -> Selection | None:
        """What the panes show now: None before the first decision."""

    def refresh_panes(self) -> None: ...

    def open_view(self, name: str) -> None:
        """Show view `name` where the attention map is (asking the worker again for what it shows)."""

    def showing(self, name: str, kind: type[Request[Any]]) -> bool:
        """Whether view `name` is open with something to show (its key then returns to attention)."""

    def refusal_of(self, action: str, brief: bool = False) -> str | None:
        """What `action` needs that the engine cannot do, in one line; None when it can."""
