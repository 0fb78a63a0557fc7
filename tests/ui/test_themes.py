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
