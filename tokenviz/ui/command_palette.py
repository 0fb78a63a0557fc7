"""The command palette's entries beyond Textual's own: every keyed command, the palette-only ones
(from the key table), the early-exit drafter for this model, and the bundled themes."""

from __future__ import annotations

from functools import partial

from textual.command import Hit, Hits, Provider

from tokenviz.ui.keys import palette_entries


class TokenvizCommands(Provider):
    async def search(self, query: str) -> Hits:
        app = self.app
        entries = list(palette_entries())
        s = getattr(app, "snapshot", None)
        if s is not None and s.info is not None and s.info.layers > 1:
            layer = s.info.layers // 2
            entries.append((f"Speculative decoding: early exit at layer {layer}", f"speculate('early-exit:{layer}')"))
        themes = [(f"Theme: {name}", name) for name in sorted(app.available_themes) if name.startswith("tokenviz")]
        matcher = self.matcher(query)
        for label, action in entries:
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(app.run_action, action), help=None)
        for label, name in themes:
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(setattr, app, "theme", name), help=None)
