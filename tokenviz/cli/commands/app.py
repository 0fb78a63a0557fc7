"""`tokenviz [PROMPT]`: the app."""

from typing import Annotated, Optional

import typer

from tokenviz.cli.backend_options import BackendChoice, journey_options
from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import (
    DEFAULT_PROMPT,
    DEFAULT_QUESTION,
    Theme,
    check_chat,
    new_cli,
    version_callback,
)
from tokenviz.cli.options import (
    Chat,
    LensLayersOption,
    System,
    fail,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.lens_layers import parse_lens_layers
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

app_cli = new_cli()


@app_cli.command(
    epilog="Headless: [bold]tokenviz trace PROMPT --steps N [--json][/] (tokenviz trace --help). "
    "Score a text: [bold]tokenviz score TEXT [--json][/]. "
    "Two runs side by side: [bold]tokenviz compare PROMPT --against temperature=0[/]. "
    "In a browser: [bold]tokenviz serve[/]. "
    "A saved journey: [bold]tokenviz replay FILE[/] (tokenviz replay --help). "
    "An SAE to try: [bold]tokenviz sae-train --text FILE --layer L --out DIR[/]."
)
@journey_options("app")
def open_app(
    settings: SamplingSettings,
    backend: BackendChoice,
    prompt: Annotated[
        Optional[str],
        typer.Argument(help=f'Text to start from. Default: "{DEFAULT_PROMPT}" (with --chat: "{DEFAULT_QUESTION}").'),
    ] = None,
    lens_layers: LensLayersOption = None,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
    restore: Annotated[
        bool,
        typer.Option(
            "--restore",
            help="Reopen the journey of this model that a process left when it died (a crash, a kill): its "
            "prompt, then each token taken again under the settings of its time. The app says when there is one.",
        ),
    ] = False,
    sae: Annotated[
        Optional[list[str]],
        typer.Option(
            "--sae",
            help="A sparse autoencoder's folder (SAELens, Gemma Scope 2 or sparsify; repeatable): F shows its "
            "features at the cursor, and the interventions dialog steers (sae-steer) or clamps (sae-clamp) one.",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Watch a language model think, one token at a time. With --endpoint, the model a server runs (an
    OpenAI-compatible one, as vLLM's): a request per token, the settings sent with it."""
    from tokenviz.system.paths import journal_folder
    from tokenviz.worker.engine_thread import EngineWorker
    from tokenviz.worker.journaling import Journaling

    try:
        check_theme(theme)
        check_chat(chat, system)
        chosen_rows = None if lens_layers is None else parse_lens_layers(lens_layers)
        if sae:  # read here, before the model: a bad one is one line (torch is imported for it)
            from tokenviz.cli.headless import saes_in

            saes_in(sae)
    except TokenvizError as exc:
        fail(str(exc))
    try:  # a server is asked first: one that cannot answer is told before anything else waits
        loader = backend.loader(settings)
    except TokenvizError as exc:
        fail(str(exc))
    in_terminal.require_terminal()
    text = prompt if prompt is not None else (DEFAULT_QUESTION if chat else DEFAULT_PROMPT)
    journaling = Journaling(journal_folder(), restore)
    worker = EngineWorker(loader, settings, text, chat, system, chosen_rows, journaling, tuple(sae or ()))
    in_terminal.run_app(worker, theme)
