"""`tokenviz [PROMPT]`: the app."""

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import (
    DEFAULT_PROMPT,
    DEFAULT_QUESTION,
    Theme,
    check_chat,
    new_cli,
    served_loader,
    served_options,
    version_callback,
)
from tokenviz.cli.options import (
    ApiKeyEnv,
    ApiKeyFile,
    Chat,
    Endpoint,
    InsecureHttp,
    LensLayersOption,
    LocalTokenizer,
    ModelChoice,
    ServedModel,
    System,
    fail,
    model_options,
    sampling_options,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.lens_layers import parse_lens_layers
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

if TYPE_CHECKING:
    pass

app_cli = new_cli()


@app_cli.command(
    epilog="Headless: [bold]tokenviz trace PROMPT --steps N [--json][/] (tokenviz trace --help). "
    "Score a text: [bold]tokenviz score TEXT [--json][/]. "
    "Two runs side by side: [bold]tokenviz compare PROMPT --against temperature=0[/]. "
    "In a browser: [bold]tokenviz serve[/]. "
    "A saved journey: [bold]tokenviz replay FILE[/] (tokenviz replay --help)."
)
@sampling_options()
@model_options()
def open_app(
    settings: SamplingSettings,
    model: ModelChoice,
    prompt: Annotated[
        Optional[str],
        typer.Argument(help=f'Text to start from. Default: "{DEFAULT_PROMPT}" (with --chat: "{DEFAULT_QUESTION}").'),
    ] = None,
    lens_layers: LensLayersOption = None,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
    tokenizer: LocalTokenizer = None,
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Watch a language model think, one token at a time. With --endpoint, the model a server runs (an
    OpenAI-compatible one, as vLLM's): a request per token, the settings sent with it."""
    from tokenviz.worker.engine_thread import EngineWorker

    try:
        check_theme(theme)
        check_chat(chat, system)
        chosen_rows = None if lens_layers is None else parse_lens_layers(lens_layers)
    except TokenvizError as exc:
        fail(str(exc))
    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, tokenizer)
    # (a server is asked first: one that cannot answer is told before anything else waits)
    loader = model.loader() if served is None else served_loader(model, settings, served, tokenizer)
    in_terminal.require_terminal()
    text = prompt if prompt is not None else (DEFAULT_QUESTION if chat else DEFAULT_PROMPT)
    worker = EngineWorker(loader, settings, text, chat=chat, system=system, lens_layers=chosen_rows)
    in_terminal.run_app(worker, theme)
