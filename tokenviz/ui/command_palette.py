"""The command palette: every keyed command of the screen it opens over, the palette-only ones
(from the key table) and the theme picker. It is the app's only provider, so the palette opens on
tokenviz's own commands, in the key table's order, each listed once."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tokenviz.ui.keys import palette_entries
from tokenviz.ui.worker_screen import WorkerScreen


class TokenvizCommands(Provider):
    def _entries(self) -> list[tuple[str, str]]:
        screen = self.screen
        return palette_entries(screen.KEY_ROWS, screen.PALETTE_ONLY) if isinstance(screen, WorkerScreen) else []

    async def discover(self) -> Hits:
        for label, action in self._entries():
            yield DiscoveryHit(label, partial(self.screen.run_action, action))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, action in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self.screen.run_action, action), help=None)
