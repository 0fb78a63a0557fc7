"""The colours the panes draw with, resolved once per theme.

The bundled themes (themes/*.toml) set every variable below. Any other Textual theme picked from
the palette falls back to colours derived from that theme's own, so nothing clashes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import App
from textual.theme import Theme

from tokenviz.files.journey_page import DEFAULT_HEATMAP as PAGE_HEATMAP

DEFAULT_HEATMAP = " ".join(PAGE_HEATMAP)  # as a theme variable: the stops, dark violet to yellow (plasma)


@dataclass(frozen=True)
class ThemeColors:
    heatmap_stops: tuple[str, ...]  # low to high
    heatmap_masked: str  # the causal future
    bar: str  # the model's raw probabilities
    bar_final: str  # after the sampling stages
    chip_prompt: str
    chip_generated: str
    chip_newest: str
    chip_cursor: str
    chosen: str  # the token taken


def _theme_colors(theme: Theme) -> ThemeColors:
    v = theme.variables
    background = theme.background or ("#ffffff" if not theme.dark else "#000000")
    primary = theme.primary
    accent = theme.accent or primary
    success = theme.success or primary
    return ThemeColors(
        heatmap_stops=tuple(v.get("heatmap-stops", DEFAULT_HEATMAP).split()),
        heatmap_masked=v.get("heatmap-masked", theme.surface or background),
        bar=v.get("bar-color", primary),
        bar_final=v.get("bar-final-color", accent),
        chip_prompt=v.get("chip-prompt", theme.panel or background),
        chip_generated=v.get("chip-generated", theme.secondary or primary),
        chip_newest=v.get("chip-newest", success),
        chip_cursor=v.get("chip-cursor", accent),
        chosen=v.get("chosen-color", success),
    )


_resolved: dict[str, ThemeColors] = {}


def theme_colors(theme: Theme) -> ThemeColors:
    """The colours of `theme` (computed once per theme name)."""
    if theme.name not in _resolved:
        _resolved[theme.name] = _theme_colors(theme)
    return _resolved[theme.name]


def app_colors(app: App[object]) -> ThemeColors:
    """The colours of the app's theme, found by its name: App.current_theme copies the table of
    every registered theme on each call, and the panes ask once per chip and row."""
    colors = _resolved.get(app.theme)
    return colors if colors is not None else theme_colors(app.current_theme)


def page_colors(theme: Theme) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """The colours of `theme` for a journey's HTML page (see render.journey_page), as pairs."""
    c = theme_colors(theme)
    background = theme.background or ("#ffffff" if not theme.dark else "#000000")
    return (
        ("background", background),
        ("foreground", theme.foreground or ("#000000" if not theme.dark else "#ffffff")),
        ("panel", theme.panel or c.chip_prompt),
        ("primary", theme.primary),
        ("bar", c.bar),
        ("bar_final", c.bar_final),
        ("chip_prompt", c.chip_prompt),
        ("chip_generated", c.chip_generated),
        ("chosen", c.chosen),
        ("heatmap", c.heatmap_stops),
    )
