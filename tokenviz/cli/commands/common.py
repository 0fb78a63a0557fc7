"""What the commands share: their defaults, the checks of their options and
how a document is printed."""

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from tokenviz import __version__
from tokenviz.cli.options import (
    fail,
    option_group,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.features import is_feature_watch, parse_feature_watch
from tokenviz.contract.results import ATTRIBUTION_METHODS, AttributionMethod
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


@dataclass(frozen=True)
class Outputs:
    """The files a headless run writes beside its document, each checked writable before any work."""

    save: str | None = None  # the replayable journey
    html: str | None = None  # the journey as a page
    force: bool = False  # replace a file that exists


OUTPUT_OPTIONS: dict[str, tuple[Any, Any]] = {
    "save": (Optional[str], typer.Option("--save", help="Also write the replayable journey to this .json file.")),
    "html": (
        Optional[str],
        typer.Option("--html", help="Also write the journey as a self-contained HTML page (any browser, offline)."),
    ),
    "force": (bool, typer.Option("--force", help="Let --save and --html replace an existing file.")),
}


def output_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command --save, --html and --force; it receives them as `outputs` (Outputs)."""

    def make(values: dict[str, Any], given: frozenset[str]) -> Outputs:
        outputs = Outputs(**values)
        for path in (outputs.save, outputs.html):
            if path:
                check_writable(path, outputs.force)
        return outputs

    return option_group("outputs", OUTPUT_OPTIONS, make)


@dataclass(frozen=True)
class Search:
    """A search instead of sampling: a beam search of `beams`' width, or speculative decoding drafted
    as `speculate` names (by `draft_model` for a draft-model, which alone implies it)."""

    beams: int | None = None
    speculate: str | None = None
    draft_model: str | None = None

    @property
    def named(self) -> str:
        """The option that asked for it ("" for none): what a refusal names."""
        return "--beams" if self.beams else "--speculate" if self.speculate else ""


SEARCH_OPTIONS: dict[str, tuple[Any, Any]] = {
    "beams": (Optional[int], typer.Option("--beams", help="Beam search of this width (2-8) instead of sampling.")),
    "speculate": (
        Optional[str],
        typer.Option("--speculate", help="Speculative decoding: prompt-lookup, early-exit:LAYER or draft-model."),
    ),
    "draft_model": (Optional[str], typer.Option("--draft-model", help="The drafter for --speculate draft-model.")),
}


def search_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command --beams, --speculate and --draft-model; it receives them as `search` (Search)."""

    def make(values: dict[str, Any], given: frozenset[str]) -> Search:
        search = Search(**values)
        if search.beams is not None and not 2 <= search.beams <= 8:
            raise TokenvizError(f"--beams must be 2 to 8, got {search.beams}")
        if search.beams and search.speculate:
            raise TokenvizError("choose --beams or --speculate, not both")
        if search.draft_model and not search.speculate:
            return Search(search.beams, "draft-model", search.draft_model)
        return search

    return option_group("search", SEARCH_OPTIONS, make)


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


@dataclass(frozen=True)
class StepViews:
    """What each step of a trace gains beside its own numbers (the lens's rows are --lens-layers')."""

    lens: bool = False
    routing: bool = False
    attribution: AttributionMethod | None = None
    watch: tuple[str, ...] = ()
    attention: int | None = None
    sae: tuple[str, ...] = ()

    @property
    def watched_tokens(self) -> tuple[str, ...]:
        return tuple(w for w in self.watch if not is_feature_watch(w))

    @property
    def watched_features(self) -> tuple[tuple[str, int], ...]:
        """Each feature watched (feature:SAE:ID): (the SAE's name, the feature)."""
        return tuple(parse_feature_watch(w) for w in self.watch if is_feature_watch(w))


STEP_VIEW_OPTIONS: dict[str, tuple[Any, Any]] = {
    "lens": (bool, typer.Option("--lens", help="Add each step's logit lens (every layer's top tokens).")),
    "routing": (bool, typer.Option("--routing", help="Add each step's mixture-of-experts routing: every MoE layer's "
                                   "experts and weights.")),
    "attribution": (Optional[str], typer.Option("--attribution", help="Add to each step how much each earlier token "
                    "led to its chosen token: loo (leave-one-out, exact, one forward pass per token of context) or "
                    "grad (gradient × input, one backward pass).")),
    "watch": (Optional[list[str]], typer.Option("--watch", help="Follow this token at every step (its text, with its "
              "leading space, or id:N; up to 4, repeat the option): each step gains its raw and final probability "
              "and rank; with two, each step also gains their logit difference split by layer. feature:SAE:ID follows "
              "a feature of an SAE given with --sae: each step gains its activation.")),
    "attention": (Optional[int], typer.Option("--attention", help="Add each step's attention row at this layer (from "
                  "0): every head's weights over the positions before, for the position whose pass gave the step's "
                  "distribution.")),
    "sae": (Optional[list[str]], typer.Option("--sae", help="Add each step's features of this sparse autoencoder, a "
            "folder on disk (SAELens', Gemma Scope 2's or sparsify's layout; repeatable): its active features, their "
            "activations and shares, L0, error.")),
}  # fmt: skip


def step_view_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give trace its per-step views' options; it receives them as `views` (StepViews)."""

    def make(values: dict[str, Any], given: frozenset[str]) -> StepViews:
        method = values.get("attribution")
        if method is not None and method not in ATTRIBUTION_METHODS:
            raise TokenvizError(f"--attribution must be loo or grad, got {method!r}")
        lists = {name: tuple(values.get(name) or ()) for name in ("watch", "sae")}
        views = StepViews(**{**{n: v for n, v in values.items() if v is not None}, **lists})
        if views.watched_features and not views.sae:
            raise TokenvizError("--watch feature:SAE:ID follows a feature of an SAE given with --sae DIR")
        return views

    return option_group("views", STEP_VIEW_OPTIONS, make)
