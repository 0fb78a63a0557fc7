"""`tokenviz score TEXT`: how likely the model finds a text."""

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands.common import check_chat, check_writable, new_cli, print_document
from tokenviz.cli.options import (
    Chat,
    System,
    fail,
    grammar_options,
    stderr_progress,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.journey.against_base import DEFAULT_WINDOW
from tokenviz.system.reading import read_file

TEXT_FILE_BYTES = 64 * 2**20  # the most of a file scored against a base that is read

score_cli = new_cli()


@score_cli.command()
@backend_options("score")
@grammar_options()
def score(
    grammar: Grammar | None,
    backend: BackendChoice,
    text: Annotated[str, typer.Argument(help="The text to score (against a base: the text or a file of it).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    chat: Chat = False,
    system: System = None,
    against_model: Annotated[
        Optional[str],
        typer.Option(
            "--against-model",
            help="Score the text against this base model as llama-perplexity's --kl-divergence does: its "
            "statistics (KL divergence, Δp, same top, the perplexity ratio) of --model against it.",
        ),
    ] = None,
    against_backend: Annotated[
        Optional[str],
        typer.Option("--against-backend", help="The base's backend (default: --backend's); with --against-model."),
    ] = None,
    window: Annotated[
        Optional[int],
        typer.Option(
            "--window",
            help=f"With a base: the window in tokens (llama-perplexity's --ctx-size; default {DEFAULT_WINDOW}, or "
            "llama.cpp's --context where given); the second half of each is scored.",
        ),
    ] = None,
    html: Annotated[
        Optional[str],
        typer.Option("--html", help="With a base: also write the text coloured by KL divergence as an offline page."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --html replace an existing file.")] = False,
) -> None:
    """Score a text: each token's log-probability, probability and rank, the entropy and top
    candidates there, the total log-probability and the perplexity (one forward pass). With a
    grammar (--json-schema, --regex, --grammar), which the text follows from its first token, each
    token's log-probability under it too (one more pass). With --endpoint, on the model a server runs
    (its prompt log-probabilities, one request: the server's top candidates, the entropy's floor). With
    --against-model or --against-backend: the text (or the file it names) scored against that base in
    llama-perplexity's windows and terms (its --kl-divergence statistics)."""
    if against_model is not None or against_backend is not None or window is not None or html is not None:
        against = Against(against_model, against_backend, window, html, force)
        score_against(backend, text, against, as_json, grammar, chat)
        return
    try:
        loader = backend.loader(SamplingSettings(grammar=grammar))
    except TokenvizError as exc:
        fail(str(exc))
    from tokenviz.cli.table import print_score
    from tokenviz.journey.score import score_text
    from tokenviz.journey.session import Session

    try:
        check_chat(chat, system)
        with stderr_progress() as progress:
            session = Session(loader(progress))
            document = score_text(session, text, chat=chat, system=system, grammar=grammar)
    except TokenvizError as exc:
        fail(str(exc))
    if as_json:
        print_document(document, as_json=True)
    else:
        print_score(document, Console())


@dataclass(frozen=True)
class Against:
    """score's options for a base to score against."""

    model: str | None
    backend: str | None
    window: int | None
    html: str | None
    force: bool


def score_against(
    backend: BackendChoice, text: str, against: Against, as_json: bool, grammar: Grammar | None, chat: bool
) -> None:
    """`score --against-model/--against-backend`: llama-perplexity's statistics of --model against the base."""
    from tokenviz.cli.table import print_against_base
    from tokenviz.files.quantization_page import save_quantization_page
    from tokenviz.journey.against_base import check_window, score_against_base

    try:
        if against.model is None and against.backend is None:
            raise TokenvizError(
                "--window and --html go with a base to score against: --against-model or --against-backend"
            )
        if grammar is not None or chat:
            raise TokenvizError("scoring against a base takes the text as it is: no grammar and no --chat")
        if against.html:
            check_writable(against.html, against.force)
        size = window_of(backend, against)
        check_window(size)
        q_side, base_side = backend.sides(against.backend)
        base_side = base_side.with_values(model=against.model or base_side.model)
        words = text_or_file(text)
        with stderr_progress() as progress:
            q = q_side.loader(SamplingSettings())(progress)
            base = base_side.loader(SamplingSettings())(progress)

            def told(done: int, total: int) -> None:
                progress(f"scoring window {done} of {total}", done / total)

            document = score_against_base(q, base, words, size, told)
        if against.html:
            save_quantization_page(against.html, document, replace=against.force)
    except TokenvizError as exc:
        fail(str(exc))
    if as_json:
        print_document(document, as_json=True)
    else:
        print_against_base(document, Console())


def window_of(backend: BackendChoice, against: Against) -> int:
    """The window scored against a base: --window, else llama.cpp's --context (llama-perplexity's -c is both
    its context and its window), else DEFAULT_WINDOW."""
    if against.window is not None:
        return against.window
    context = backend.values.get("context") if "context" in backend.given else None
    return context if isinstance(context, int) else DEFAULT_WINDOW


def text_or_file(text: str) -> str:
    """`text`, or the text of the file it names (UTF-8, a regular file of at most TEXT_FILE_BYTES)."""
    path = Path(text).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a text longer than a file's name can be, or one holding a NUL
        return text
    if not is_file:
        return text
    what = f"the text file {safe_text(path.name)}"
    try:
        return read_file(path, TEXT_FILE_BYTES, what, TokenvizError).decode("utf-8")
    except UnicodeDecodeError:
        raise TokenvizError(f"{what} is not UTF-8 text") from None
