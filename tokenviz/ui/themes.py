"""Colour themes from the top-level themes/ folder, as Textual Theme objects.

A wheel carries the folder inside the package (tokenviz/themes); a source checkout or an
editable install reads it from the repository root.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from textual.theme import Theme

from tokenviz.contract.errors import TokenvizError

DEFAULT_THEME = "tokenviz-dark"
THEME_FIELDS = (
    "primary",
    "secondary",
    "accent",
    "warning",
    "error",
    "success",
    "foreground",
    "background",
    "surface",
    "panel",
    "dark",
)


def themes_dir() -> Path:
    package = Path(__file__).parents[1]  # tokenviz/
    for candidate in (package / "themes", package.parent / "themes"):
        if candidate.is_dir():
            return candidate
    raise TokenvizError("the themes folder is missing from this installation")


def load_theme(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text())
        return Theme(
            name=data["name"],
            variables=dict(data.get("variables", {})),
            **{k: data[k] for k in THEME_FIELDS if k in data},
        )
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise TokenvizError(f"theme file {path.name} is not valid: {exc}") from None


def load_themes() -> dict[str, Theme]:
    return {t.name: t for t in (load_theme(p) for p in sorted(themes_dir().glob("*.toml")))}


def check_theme(name: str) -> None:
    """Raise a one-line error unless `name` is one of the bundled themes."""
    themes = load_themes()
    if name not in themes:
        raise TokenvizError(f"unknown theme {name!r}; available: {', '.join(sorted(themes))}")
