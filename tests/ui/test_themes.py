"""Themes: at least three files, loaded as Textual themes, shipped inside the wheel."""

import subprocess
import sys
import zipfile

import pytest
from textual.theme import Theme

from tokenviz.render.colors import parse_hex
from tokenviz.ui.themes import load_theme, load_themes, themes_dir


def test_three_themes_with_heatmap_and_bar_colours():
    themes = load_themes()
    assert {"tokenviz-dark", "tokenviz-light", "tokenviz-contrast"} <= set(themes)
    assert themes["tokenviz-light"].dark is False and themes["tokenviz-dark"].dark is True
    for theme in themes.values():
        assert isinstance(theme, Theme)
        stops = theme.variables["heatmap-stops"].split()
        assert len(stops) >= 2 and all(parse_hex(s) for s in stops)
        for name in ("bar-color", "bar-final-color", "chosen-color", "chip-cursor", "heatmap-masked"):
            parse_hex(theme.variables[name])


def test_the_lowest_weights_never_look_like_the_masked_future():
    from tokenviz.render.colors import ramp

    for name, theme in load_themes().items():
        masked = parse_hex(theme.variables["heatmap-masked"])
        lowest = ramp(theme.variables["heatmap-stops"].split(), 64)[:6]  # about the lowest tenth of the scale
        for color in lowest:
            distance = sum((a - b) ** 2 for a, b in zip(parse_hex(color), masked)) ** 0.5
            assert distance > 40, (name, color)


def test_a_broken_theme_file_gives_one_line(tmp_path):
    from tokenviz.contract.errors import TokenvizError

    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(TokenvizError, match=r"theme file bad\.toml is not valid"):
        load_theme(bad)


def test_unknown_theme_lists_the_available_ones(monkeypatch, capsys):
    from tokenviz.cli import run

    monkeypatch.setattr(sys, "argv", ["tokenviz", "--theme", "neon"])
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown theme 'neon'; available: tokenviz-contrast, tokenviz-dark, tokenviz-light"


def test_the_wheel_carries_the_themes(tmp_path):
    root = themes_dir().parent
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("tokenviz-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for theme in ("tokenviz-dark", "tokenviz-light", "tokenviz-contrast"):
        assert f"tokenviz/themes/{theme}.toml" in names


async def test_a_theme_switch_repaints_every_cell_and_the_palette_finds_themes_by_name():
    import re

    from apptools import make_app, settle
    from textual.command import CommandPalette

    from tokenviz.ui.command_palette import ThemePicker, theme_choices

    app = make_app(theme="tokenviz-contrast")
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await settle(app, pilot)
        await pilot.pause(0.2)
        black = "#000000"  # the contrast theme's background and surface
        assert app.export_screenshot().count(f'fill="{black}"') > 100
        app.theme = "tokenviz-light"
        await pilot.pause(0.5)
        assert f'fill="{black}"' not in app.export_screenshot()  # no cell kept from the old theme
        names = [name for name, _ in theme_choices(app)]
        assert names[:3] == ["tokenviz-contrast", "tokenviz-dark", "tokenviz-light"] and len(names) > 3
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"dark")
        await pilot.pause(0.5)
        palette = app.screen
        assert isinstance(palette, CommandPalette)
        shown = [str(option.prompt) for option in palette.query_one("CommandList").options]
        assert any(re.search(r"Theme: tokenviz-dark", text) for text in shown), shown
        await pilot.press("escape")
        app.search_themes()
        await pilot.pause(0.2)
        assert ThemePicker in [type(p) for p in app.screen._providers]


def test_the_help_describes_the_colours_every_theme_draws():
    """Issue 51, item 11: the help said 'grey chips' and 'brighter = more weight', false in the light
    theme (heavy attention is dark navy there). What it says now holds in each theme: the heatmap's
    heavy end is brighter than its light end on a dark theme and darker on a light one."""
    from tokenviz.ui.screens import HELP

    assert "grey chips" not in HELP and "brighter = more weight" not in HELP
    assert "brighter on a dark" in HELP and "darker on a light one" in HELP

    def luminance(hex_color: str) -> float:
        r, g, b = parse_hex(hex_color)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    for name, theme in load_themes().items():
        stops = theme.variables["heatmap-stops"].split()
        heavier_is_brighter = luminance(stops[-1]) > luminance(stops[0])
        assert heavier_is_brighter == theme.dark, name
