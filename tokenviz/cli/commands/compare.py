"""`tokenviz compare PROMPT`: two journeys side by side."""

import dataclasses
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import (
    DEFAULT_PROMPT,
    Theme,
    check_chat,
    connected,
    new_cli,
    print_document,
    print_result,
    served_options,
)
from tokenviz.cli.options import (
    ApiKeyEnv,
    ApiKeyFile,
    Chat,
    InsecureHttp,
    ModelChoice,
    ServedModel,
    System,
    fail,
    model_options,
    sampling_options,
    stderr_progress,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

if TYPE_CHECKING:
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.journey.comparison import Comparison
    from tokenviz.worker.comparing import Build
    from tokenviz.worker.loader import Progress

compare_cli = new_cli()


@compare_cli.command()
@backend_options("compare")
@sampling_options(leave_out=("max_new_tokens",))
@model_options()
def compare(
    settings: SamplingSettings,
    model: ModelChoice,
    backend: BackendChoice,
    prompt: Annotated[str, typer.Argument(help="Text both journeys start from.")] = DEFAULT_PROMPT,
    against: Annotated[
        Optional[list[str]],
        typer.Option(
            "--against",
            help="B's sampling setting NAME=VALUE where it differs from A's (repeatable): temperature=0, top-k=10...",
        ),
    ] = None,
    against_model: Annotated[
        Optional[str], typer.Option("--against-model", help="B's model (it must share A's tokenizer).")
    ] = None,
    against_dtype: Annotated[Optional[str], typer.Option("--against-dtype", help="B's dtype.")] = None,
    against_backend: Annotated[
        Optional[str],
        typer.Option(
            "--against-backend",
            help="B runs on this backend (A on --backend's): the same GGUF in llama.cpp beside transformers' "
            "float model of it, each step's KL and where their top-1s part.",
        ),
    ] = None,
    against_quantize: Annotated[
        Optional[str], typer.Option("--against-quantize", help="B is A's model quantized: int8 or int4.")
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
    as_json: Annotated[
        bool, typer.Option("--json", help="Step both to the end and print one JSON document with their diff.")
    ] = False,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
    against_endpoint: Annotated[
        Optional[str],
        typer.Option(
            "--against-endpoint",
            help="B is the model a server runs at this URL (OpenAI-compatible, as vLLM's): is it what yours computes?",
        ),
    ] = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
) -> None:
    """Two journeys on one prompt, side by side and stepped together: two sampling settings (A's options
    and --against; a grammar and another or none: --against-grammar), two dtypes (--dtype and
    --against-dtype), a model and its quantized self
    (--against-quantize) or two models sharing a tokenizer (--model and --against-model). Per step:
    the KL divergence of their raw distributions, whether their top-1 agree, the rank each gives the
    other's choice; and where their paths part."""
    served = served_options(against_endpoint, served_model, api_key_env, api_key_file, insecure_http)
    if served is not None:
        others = (against, against_model, against_dtype, against_quantize, against_grammar, chat)
        if any(others) or settings.grammar is not None:
            fail("--against-endpoint compares the same settings on both sides: it takes no other --against option")
        b_settings = settings.replace(max_new_tokens=steps)
        if not as_json and in_terminal.can_draw():  # the comparison screen; elsewhere, a table
            try:
                check_theme(theme)
            except TokenvizError as exc:
                fail(str(exc))
            from tokenviz.worker.comparing import CompareWorker

            worker = CompareWorker(served_pair(b_settings, model, served), prompt)
            in_terminal.run_app(worker, theme, comparing=True)
        compare_served(prompt, b_settings, model, served, as_json)
        return
    try:
        if steps < 1:
            raise TokenvizError(f"--steps must be at least 1, got {steps}")
        check_chat(chat, system)
        check_theme(theme)
        a = settings.replace(max_new_tokens=steps)
        b = a.changed(against or [])
        if against_grammar is not None:
            from tokenviz.files.grammar_file import grammar_from_line

            b = b.replace(grammar=grammar_from_line(against_grammar))
        b_model = dataclasses.replace(
            model,
            model=against_model or model.model,
            dtype=against_dtype or model.dtype,
            quantize=against_quantize or model.quantize,
        )
    except TokenvizError as exc:
        fail(str(exc))

    def build(progress: "Progress") -> "Comparison":
        from tokenviz.cli.headless import compare_sessions

        return compare_sessions(a, b, model, b_model, progress, backend, against_backend)

    if as_json:
        from tokenviz.cli.headless import compare_document

        try:
            with stderr_progress() as progress:
                document = compare_document(build(progress), prompt, chat=chat, system=system, progress=progress)
        except TokenvizError as exc:
            fail(str(exc))
        print_document(document, as_json=True)
        return
    in_terminal.require_terminal("tokenviz compare PROMPT ... --json")
    from tokenviz.worker.comparing import CompareWorker

    in_terminal.run_app(CompareWorker(build, prompt, chat=chat, system=system), theme, comparing=True)


def served_pair(settings: SamplingSettings, model: ModelChoice, served: "ServedChoice") -> "Build":
    """The comparison screen's loader with a served B: the server checked to answer and to serve the
    model before the app opens (an unreachable one is one line within seconds); A loaded, then B asked."""
    endpoint, name = connected(served)

    def build(progress: "Progress") -> "Comparison":
        from tokenviz.backends.registry import engine_of
        from tokenviz.backends.served.engine import ServedEngine
        from tokenviz.journey.served_comparison import ServedComparison
        from tokenviz.journey.session import Session

        a = Session(engine_of(model.load(progress)), settings)
        progress(f"asking {endpoint.host} about {name}", None)
        return ServedComparison(a, Session(engine_of(ServedEngine(endpoint, name)), settings))

    return build


def compare_served(
    prompt: str, settings: SamplingSettings, model: ModelChoice, served: "ServedChoice", as_json: bool
) -> None:
    """compare --against-endpoint headless: the comparison screen's pair (served_pair) stepped to the end."""
    from tokenviz.cli.headless import compare_document
    from tokenviz.cli.table import print_served_comparison

    build = served_pair(settings, model, served)  # (an unreachable server is told before A loads)
    try:
        with stderr_progress() as progress:
            document = compare_document(build(progress), prompt, progress=progress)
    except TokenvizError as exc:
        fail(str(exc))
    print_result(document, as_json, print_served_comparison)
