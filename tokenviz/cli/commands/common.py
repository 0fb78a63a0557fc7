"""What the commands share: their defaults, the checks of their options and
how a document is printed."""

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tokenviz import __version__
from tokenviz.cli.options import (
    fail,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.system.paths import unwritable_folder
from tokenviz.ui.themes import DEFAULT_THEME

DEFAULT_PROMPT = "The Eiffel Tower is located in"


DEFAULT_QUESTION = "What is the capital of France?"  # the first prompt with --chat


USAGE_ERROR = 2  # click's exit code for a mistyped command line, and tokenviz's for any foreseeable mistake


Theme = Annotated[str, typer.Option(help="Colour theme (see themes/).")]


def check_chat(chat: bool, system: str | None) -> None:
    if system is not None and not chat:
        raise TokenvizError("--system needs --chat: a system message comes before a chat message")


def in_a_browser() -> bool:
    """Running under `tokenviz serve`: textual-serve drives the app through its web driver."""
    return os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver")


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tokenviz {__version__}")
        raise typer.Exit()


def new_cli() -> typer.Typer:
    return typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)


def print_result(document: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any], Console], None]) -> None:
    """A headless command's document: strict JSON on stdout, or its table."""
    if as_json:
        print_document(document, as_json=True)
    else:
        table(document, Console())


def check_writable(path: str, force: bool) -> None:
    """Refuse, before any work, a file that cannot be written where it is asked for: one that exists
    (without `force`), or one whose directory is missing or closed to writing."""
    target = Path(path).expanduser()
    if target.exists() and not force:
        raise TokenvizError(f"{path} exists already: choose another name (or --force to replace it)")
    problem = unwritable_folder(target.parent)
    if problem:
        raise TokenvizError(f"cannot write {path}: {problem}")


def default_page_colors() -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """The default theme's colours for an HTML page."""
    from tokenviz.ui.colors import page_colors
    from tokenviz.ui.themes import load_themes

    return page_colors(load_themes()[DEFAULT_THEME])


def print_document(document: dict[str, Any], as_json: bool) -> None:
    from tokenviz.cli.table import print_table

    if as_json:
        try:
            text = json.dumps(document, ensure_ascii=False, allow_nan=False)  # strict JSON
        except ValueError:
            fail("the run produced numbers that are not finite (NaN or infinity): are the model's weights damaged?")
        sys.stdout.write(text + "\n")
    else:
        print_table(document, Console())
