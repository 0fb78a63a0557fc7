"""`tokenviz score TEXT`: how likely the model finds a text."""

from typing import Annotated

import typer
from rich.console import Console

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands.common import check_chat, new_cli, print_document
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

score_cli = new_cli()


@score_cli.command()
@backend_options("score")
@grammar_options()
def score(
    grammar: Grammar | None,
    backend: BackendChoice,
    text: Annotated[str, typer.Argument(help="The text to score.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    chat: Chat = False,
    system: System = None,
) -> None:
    """Score a text: each token's log-probability, probability and rank, the entropy and top
    candidates there, the total log-probability and the perplexity (one forward pass). With a
    grammar (--json-schema, --regex, --grammar), which the text follows from its first token, each
    token's log-probability under it too (one more pass). With --endpoint, on the model a server runs
    (its prompt log-probabilities, one request: the server's top candidates, the entropy's floor)."""
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
