"""The command palette: every keyed command of the screen it opens over, the palette-only ones
(from the key table) and the theme picker. It is the app's only provider, so the palette opens on
tokenviz's own commands, in the key table's order, each listed once; typing a theme's name finds it
too. The theme picker lists tokenviz's own themes first."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.theme import ThemeProvider

from tokenviz.ui.keys import palette_entries
from tokenviz.ui.themes import load_themes
from tokenviz.ui.worker_screen import WorkerScreen


class TokenvizCommands(Provider):
    def _entries(self) -> list[tuple[str, str]]:
        screen = self.screen
        if not isinstance(screen, WorkerScreen):
            return []
        return palette_entries(screen.KEY_ROWS, screen.PALETTE_ONLY, screen.ACTION_OWNERS)

    def _refusal(self, action: str) -> str | None:
        """What the command needs that the screen's engine cannot do (see JourneyScreen.refusal_of)."""
        refusal_of = getattr(self.screen, "refusal_of", None)
        return refusal_of(action) if refusal_of else None

    async def discover(self) -> Hits:
        for label, action in self._entries():
            yield DiscoveryHit(label, partial(self.screen.run_action, action), help=self._refusal(action))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, action in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(label),
                    partial(self.screen.run_action, action),
                    help=self._refusal(action),
                )

        for name, choose in theme_choices(self.app):
            label = f"Theme: {name}"
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), choose, help=None)


def theme_choices(app: App[object]) -> list[tuple[str, Callable[[], None]]]:
    """(name, choose it) for every theme: tokenviz's own first, then Textual's, each by name."""
    own = set(load_themes())

    def choose(name: str) -> None:
        app.theme = name

    names = sorted(app.available_themes, key=lambda name: (name not in own, name))
    return [(name, partial(choose, name)) for name in names]


class ThemePicker(ThemeProvider):
    """Textual's theme picker, with tokenviz's themes first."""

    @property
    def commands(self) -> list[tuple[str, Callable[[], None]]]:
        return theme_choices(self.app)
