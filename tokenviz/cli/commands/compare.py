"""`tokenviz compare PROMPT`: two journeys side by side."""

from typing import Annotated, Optional

import typer

from tokenviz.cli.backend_options import BackendChoice, journey_options, option_values
from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import DEFAULT_PROMPT, Theme, check_chat, new_cli, print_result
from tokenviz.cli.options import Chat, System, fail, stderr_progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.presets import assigned
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

compare_cli = new_cli()


@compare_cli.command()
@journey_options("compare", leave_out=("max_new_tokens",))
def compare(
    settings: SamplingSettings,
    backend: BackendChoice,
    prompt: Annotated[str, typer.Argument(help="Text both journeys start from.")] = DEFAULT_PROMPT,
    against: Annotated[
        Optional[list[str]],
        typer.Option(
            "--against",
            help="B's sampling setting NAME=VALUE where it differs from A's (repeatable): temperature=0, top-k=10, "
            "or preset=NAME for a task's (factual, balanced, creative; a setting named beside it wins).",
        ),
    ] = None,
    against_model: Annotated[
        Optional[str], typer.Option("--against-model", help="B's model (it must share A's tokenizer).")
    ] = None,
    against_backend: Annotated[
        Optional[str],
        typer.Option(
            "--against-backend",
            help="B runs on this backend (A on --backend's): the same GGUF in llama.cpp beside transformers' "
            "float model of it; or the model a server runs (server, with --endpoint URL): is it what yours computes?",
        ),
    ] = None,
    against_option: Annotated[
        Optional[list[str]],
        typer.Option(
            "--against-option",
            help="B's backend option NAME=VALUE where it differs from A's (repeatable): dtype=bfloat16, "
            "quantize=int8 (transformers), flash-attention=off, threads=1 (llama.cpp); --help lists each.",
        ),
    ] = None,
    against_grammar: Annotated[
        Optional[str],
        typer.Option(
            "--against-grammar",
            help="B's grammar: none (B unconstrained), a .json file (a JSON schema), an EBNF/GBNF/Lark file, "
            "or 'regex PATTERN'.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option(help="How many tokens each journey takes at most.")] = 32,
    sae: Annotated[
        Optional[list[str]],
        typer.Option(
            "--sae",
            help="A sparse autoencoder's folder (repeatable; with --json): each step gains the features whose "
            "activations differ most between A's residual and B's, both on A's tokens (what a quantization moves).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Step both to the end and print one JSON document with their diff.")
    ] = False,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
) -> None:
    """Two journeys on one prompt, side by side and stepped together: two sampling settings (A's options
    and --against; a grammar and another or none: --against-grammar), two values of a backend's option
    (--against-option: two dtypes, a model and its quantized self, flash attention on and off), two
    models sharing a tokenizer (--model and --against-model) or two runtimes (--against-backend). Per step:
    the KL divergence of their raw distributions, whether their top-1 agree, the rank each gives the
    other's choice; and where their paths part."""
    try:
        if steps < 1:
            raise TokenvizError(f"--steps must be at least 1, got {steps}")
        check_chat(chat, system)
        check_theme(theme)
        a = settings.replace(max_new_tokens=steps)
        b = assigned(a, against or [])
        if against_grammar is not None:
            from tokenviz.files.grammar_file import grammar_from_line

            b = b.replace(grammar=grammar_from_line(against_grammar))
        a_side, b_side = backend.sides(against_backend)
        b_backend = b_side.backend()
        if not b_backend.draws:
            b_side = b_side.with_values(model=against_model or b_side.model)
            b_side = b_side.with_values(**option_values(b_backend, against_option or [], "--against-option"))
        elif any((against, against_model, against_option, against_grammar, chat)):
            raise TokenvizError(
                f"B on the {b_backend.name} backend is its model with A's settings: it takes no other --against "
                "option (nor --chat)"
            )
        else:
            b_side = b_side.with_values(model=None)  # B's model is the one its own options name
        if sae and not as_json:
            raise TokenvizError("compare --sae adds the features a difference moves to the JSON document: add --json")
        from tokenviz.cli.headless import compare_opener, saes_in

        saes = saes_in(sae or ())  # before the models: a bad one is told now
        build = compare_opener(a, b, (a_side, b_side))  # a server is asked now
    except TokenvizError as exc:
        fail(str(exc))

    if as_json or not in_terminal.can_draw():  # piped (whatever B is): the table, stepped to the end
        from tokenviz.cli.headless import add_feature_moves, compare_document
        from tokenviz.cli.table import print_comparison

        try:
            with stderr_progress() as progress:
                comparison = build(progress)
                document = compare_document(comparison, prompt, chat=chat, system=system, progress=progress)
                if saes:
                    add_feature_moves(comparison, document, saes, progress)
        except TokenvizError as exc:
            fail(str(exc))
        print_result(document, as_json, print_comparison)
        return
    from tokenviz.worker.comparing import CompareWorker

    in_terminal.run_app(CompareWorker(build, prompt, chat=chat, system=system), theme, comparing=True)
