"""The commands: `tokenviz [PROMPT]` opens the app; `tokenviz trace PROMPT` runs the journey headless;
`tokenviz score TEXT` scores a text; `tokenviz compare PROMPT` runs two journeys side by side;
`tokenviz serve` runs the app in a browser; `tokenviz replay FILE` opens a saved journey.

Every foreseeable mistake ends with one line on stderr and exit code 2, never a traceback.
"""

import atexit
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console

from tokenviz import __version__
from tokenviz.cli.options import (
    ApiKeyEnv,
    ApiKeyFile,
    Chat,
    Endpoint,
    InsecureHttp,
    LocalTokenizer,
    ModelChoice,
    ServedModel,
    System,
    err,
    fail,
    grammar_options,
    model_options,
    print_error,
    print_warning,
    sampling_options,
    stderr_progress,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import Grammar, refuse_grammar
from tokenviz.contract.interventions import Intervention, parse_ablation, parse_patch, parse_steering
from tokenviz.contract.paths import unwritable_folder
from tokenviz.contract.results import ATTRIBUTION_METHODS
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

if TYPE_CHECKING:
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot
    from tokenviz.contract.worker import Worker
    from tokenviz.files.journey_schema import Journey
    from tokenviz.journey.comparison import Comparison
    from tokenviz.served.journey import ServedChoice
    from tokenviz.worker.loader import Loader, Progress

DEFAULT_PROMPT = "The Eiffel Tower is located in"
DEFAULT_QUESTION = "What is the capital of France?"  # the first prompt with --chat
USAGE_ERROR = 2  # click's exit code for a mistyped command line, and tokenviz's for any foreseeable mistake
QUIT_WAIT_S = 0.1  # how long quitting waits for the engine thread; exit_now then ends it mid-pass
Theme = Annotated[str, typer.Option(help="Colour theme (see themes/).")]


def check_chat(chat: bool, system: str | None) -> None:
    if system is not None and not chat:
        raise TokenvizError("--system needs --chat: a system message comes before a chat message")


def in_a_browser() -> bool:
    """Running under `tokenviz serve`: textual-serve drives the app through its web driver."""
    return os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver")


def require_terminal() -> None:
    """The app draws full-screen: refuse, in one line, where it cannot."""
    if in_a_browser():
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail("tokenviz needs a terminal on stdin and stdout; for scripts use: tokenviz trace PROMPT --json")
    if os.environ.get("TERM") == "dumb":
        fail("TERM=dumb cannot draw the app; use a full terminal, or: tokenviz trace PROMPT")


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tokenviz {__version__}")
        raise typer.Exit()


def _typer() -> typer.Typer:
    return typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)


# ---- tokenviz [PROMPT]: the app ------------------------------------------------------------------

app_cli = _typer()


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
    from tokenviz.worker.engine import EngineWorker

    try:
        check_theme(theme)
        check_chat(chat, system)
    except TokenvizError as exc:
        fail(str(exc))
    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, tokenizer)
    # (a server is asked first: one that cannot answer is told before anything else waits)
    loader = model.loader() if served is None else served_loader(model, settings, served, tokenizer)
    require_terminal()
    text = prompt if prompt is not None else (DEFAULT_QUESTION if chat else DEFAULT_PROMPT)
    run_app(EngineWorker(loader, settings, text, chat=chat, system=system), theme)


def served_loader(
    model: ModelChoice, settings: SamplingSettings, served: "ServedChoice", tokenizer: str | None = None
) -> "Loader":
    """The app's loader on a served model: the server checked to answer and to serve the model before
    the app opens (an unreachable one is one line within seconds); the engine is made in the worker,
    with `tokenizer` (a Hugging Face id or directory) loaded there and checked against the server's."""
    from tokenviz.served.journey import served_model_name

    local = {"--model": model.model, "--device-map": model.device_map, "--quantize": model.quantize}
    asked = [name for name, value in {**local, "--compile": model.compile}.items() if value]
    if asked:
        fail(f"{asked[0]} is for a model loaded here: a served model (--endpoint) is the server's")
    if settings.grammar is not None:
        fail("a grammar stage needs the model's tokenizer in this process: not with --endpoint")
    try:
        endpoint = served.connect()
        name = served_model_name(endpoint, served.model)
    except TokenvizError as exc:
        fail(str(exc))

    def load(progress: "Progress") -> "ServedEngine":
        from tokenviz.backends.served.engine import ServedEngine

        here = None  # (the tokenizer named with --tokenizer, loaded in this thread)
        if tokenizer is not None:
            from tokenviz.backends.transformers.loading import load_tokenizer

            progress(f"loading the tokenizer {tokenizer}", None)
            here = load_tokenizer(tokenizer)
        progress(f"asking {endpoint.host} about {name}", 0.5)
        return ServedEngine(endpoint, name, local_tokenizer=here, model_files=tokenizer)

    return load


def run_app(worker: "Worker[Snapshot] | Worker[ComparisonSnapshot]", theme: str, comparing: bool = False) -> NoReturn:
    """Run the app on `worker` until it quits, then end the process once the writes asked for are
    done: exit 128 + N after signal N, 2 with the error's line when the model could not load, 1
    after an error the app did not handle, 0 otherwise."""
    from tokenviz.ui.app import TokenvizApp

    app = TokenvizApp(worker, theme=theme, comparing=comparing)
    app.run()
    for failure in app.finish(quit_wait_s=QUIT_WAIT_S):
        print_error(failure)
    if app.fatal_error:
        print_error(app.fatal_error)
    if app.signalled is not None:
        exit_now(128 + app.signalled)
    exit_now(2 if app.fatal_error else app.return_code or 0)  # (an unhandled error: Textual's 1, not 0)


def exit_now(code: int) -> NoReturn:
    """End the app's process once the terminal is restored and the exit handlers have run.

    Python's own shutdown would then spend about a second tearing down torch's modules, and it
    aborts the process if the engine thread is still inside a forward pass (a model loading).
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---- tokenviz trace PROMPT: headless ------------------------------------------------------------

trace_cli = _typer()


@trace_cli.command()
@sampling_options(leave_out=("max_new_tokens",))
@model_options()
def trace(
    settings: SamplingSettings,
    model: ModelChoice,
    prompt: Annotated[str, typer.Argument(help="Text to start from.")],
    steps: Annotated[int, typer.Option(help="How many tokens to generate.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    lens: Annotated[
        bool, typer.Option("--lens", help="Add each step's logit lens (every layer's top tokens).")
    ] = False,
    routing: Annotated[
        bool,
        typer.Option(
            "--routing", help="Add each step's mixture-of-experts routing: every MoE layer's experts and weights."
        ),
    ] = False,
    attribution: Annotated[
        Optional[str],
        typer.Option(
            "--attribution",
            help="Add to each step how much each earlier token led to its chosen token: loo (leave-one-out, "
            "exact, one forward pass per token of context) or grad (gradient × input, one backward pass).",
        ),
    ] = None,
    watch: Annotated[
        Optional[list[str]],
        typer.Option(
            "--watch",
            help="Follow this token at every step (its text, with its leading space, or id:N; up to 4, repeat the "
            "option): each step gains its raw and final probability and rank; with two, each step also gains their "
            "logit difference split by layer.",
        ),
    ] = None,
    save: Annotated[
        Optional[str], typer.Option("--save", help="Also write the replayable journey to this .json file.")
    ] = None,
    html: Annotated[
        Optional[str],
        typer.Option("--html", help="Also write the journey as a self-contained HTML page (any browser, offline)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --save and --html replace an existing file.")] = False,
    beams: Annotated[
        Optional[int], typer.Option("--beams", help="Beam search of this width (2-8) instead of sampling.")
    ] = None,
    speculate: Annotated[
        Optional[str],
        typer.Option("--speculate", help="Speculative decoding: prompt-lookup, early-exit:LAYER or draft-model."),
    ] = None,
    draft_model: Annotated[
        Optional[str], typer.Option("--draft-model", help="The drafter for --speculate draft-model.")
    ] = None,
    ablate: Annotated[
        Optional[list[str]],
        typer.Option("--ablate", help="LAYER.HEAD (from 0, repeatable): that head's output set to zero."),
    ] = None,
    ablate_mean: Annotated[
        bool, typer.Option("--ablate-mean", help="With --ablate: the head's mean over the prompt, not zero.")
    ] = False,
    steer: Annotated[
        Optional[list[str]],
        typer.Option(
            "--steer",
            help="LAYER:SCALE:TOWARD:AWAY (repeatable): SCALE times the residual after LAYER at the last token of "
            "TOWARD minus that of AWAY (each read alone), added after LAYER at every position.",
        ),
    ] = None,
    steer_tokens: Annotated[
        Optional[list[str]],
        typer.Option(
            "--steer-tokens",
            help="LAYER:SCALE:TOKEN_A:TOKEN_B (repeatable): the direction is TOKEN_A's unembedding row minus "
            "TOKEN_B's (each a token's text, or id:N).",
        ),
    ] = None,
    patch: Annotated[
        Optional[list[str]],
        typer.Option(
            "--patch",
            help="LAYER:POSITION:TEXT (repeatable): the residual after LAYER at POSITION (from 0) replaced by "
            "TEXT's there, TEXT read alone (another prompt, as long at least).",
        ),
    ] = None,
    attention: Annotated[
        Optional[int],
        typer.Option(
            "--attention",
            help="Add each step's attention row at this layer (from 0): every head's weights over the positions "
            "before, for the position whose pass gave the step's distribution.",
        ),
    ] = None,
    chat: Chat = False,
    system: System = None,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
    tokenizer: LocalTokenizer = None,
) -> None:
    """Run the journey headless and print every step (a table, or JSON with --json). With
    interventions (--ablate, --steer, --steer-tokens, --patch) each step also gives the model's own
    distribution at the same context and the KL from it ("unsteered"). With --endpoint, the model a
    server runs (an OpenAI-compatible one, as vLLM's), a request per token; with --tokenizer DIR and
    the vllm-lens plugin on the server, its lens and attention rows too."""
    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, tokenizer)
    loader = None
    if served is not None:
        not_served = {
            "--routing": routing, "--beams": beams, "--speculate": speculate or draft_model, "--model": model.model,
            "--device-map": model.device_map, "--quantize": model.quantize, "--compile": model.compile,
        }  # fmt: skip
        asked = [name for name, value in not_served.items() if value]
        if asked:
            fail(f"{asked[0]} is not available on a served model yet (--endpoint): it needs the model in this process")
        if ablate:
            from tokenviz.backends.served.steering import NO_ABLATION

            fail(f"--ablate: {NO_ABLATION}")
        session_options = (lens, attention is not None, attribution, watch, save, html, chat, tokenizer)
        if not any((*session_options, steer, steer_tokens, patch)):  # the journey alone: torch-free (tokenviz.served)
            run_served_trace(prompt, settings.replace(max_new_tokens=steps), served, as_json)
            return
        loader = served_loader(model, settings, served, tokenizer)
    try:  # every option checked before torch is imported: a mistake is told in a moment
        check_trace(steps, save, html, force, beams, speculate, lens or routing, attribution, watch)
        interventions: tuple[Intervention, ...] = (
            *(parse_ablation(a, mean=ablate_mean) for a in ablate or ()),
            *(parse_steering(s) for s in steer or ()),
            *(parse_steering(s, by="tokens") for s in steer_tokens or ()),
            *(parse_patch(p) for p in patch or ()),
        )
        if ablate_mean and not ablate:
            raise TokenvizError("--ablate-mean goes with --ablate LAYER.HEAD")
        if beams or speculate:
            refuse_grammar(settings.grammar, "beam search" if beams else "speculative decoding")
        check_chat(chat, system)
    except TokenvizError as exc:
        fail(str(exc))
    if draft_model and not speculate:
        speculate = "draft-model"
    from tokenviz.cli.headless import SaveFailed, run_trace

    written: list[tuple[str, Path]] = []
    try:
        with stderr_progress() as progress:
            document = run_trace(
                prompt,
                settings.replace(max_new_tokens=steps),
                model=model,
                progress=progress,
                lens=lens,
                routing=routing,
                attribution=next((m for m in ATTRIBUTION_METHODS if m == attribution), None),
                watch=tuple(watch or ()),
                save=save,
                html=(html, default_page_colors()) if html else None,
                force=force,
                beams=beams,
                speculate=speculate,
                draft_model=draft_model,
                chat=chat,
                system=system,
                written=written,
                interventions=interventions,
                attention=attention,
                loader=loader,
            )
    except SaveFailed as exc:
        print_document(exc.document, as_json)  # the run's output is not lost with the file
        fail(str(exc))
    except TokenvizError as exc:
        fail(str(exc))
    for what, where in written:  # on stderr: stdout is the document's
        err.print(f"wrote {where} ({what})", highlight=False, markup=False, soft_wrap=True)
    print_document(document, as_json)


def served_options(
    url: str | None,
    model: str | None,
    key_env: str | None,
    key_file: str | None,
    insecure_http: bool,
    tokenizer: str | None = None,
    url_option: str = "--endpoint",
    takes_tokenizer: bool = True,
) -> "ServedChoice | None":
    """The served options as one value, or None without a server's URL, where any of the others given
    is refused in one line (tokenviz.served is imported only when a command is served)."""
    if url is None:
        if model or key_env or key_file or insecure_http or tokenizer:
            names = ["--served-model", "--api-key-env", "--api-key-file", "--insecure-http"]
            names += ["--tokenizer"] if takes_tokenizer else []
            fail(f"{', '.join(names[:-1])} and {names[-1]} go with {url_option} URL")
        return None
    from tokenviz.served.endpoint import ApiKey
    from tokenviz.served.journey import ServedChoice

    key = ApiKey(key_env, key_file)
    if (exposed := key.exposed()) is not None:
        print_warning(exposed)
    return ServedChoice(url, model, key, insecure_http)


def run_served_trace(prompt: str, settings: SamplingSettings, served: "ServedChoice", as_json: bool) -> None:
    """trace --endpoint: the journey on the model a server runs (tokenviz.served), torch never imported."""
    from tokenviz.cli.table import print_served

    def say(line: str) -> None:
        err.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)

    try:
        journey = served.open(settings, say)
        journey.start(prompt)
        journey.run()
    except TokenvizError as exc:
        fail(str(exc))
    print_result(journey.document(), as_json, print_served)


def run_served_score(text: str, served: "ServedChoice", as_json: bool) -> None:
    """score --endpoint: the text's prompt log-probabilities from the server (tokenviz.served)."""
    from tokenviz.cli.table import print_score

    try:
        document = served.open(SamplingSettings()).score(text)
    except TokenvizError as exc:
        fail(str(exc))
    print_result(document, as_json, print_score)


def compare_served(
    prompt: str, settings: SamplingSettings, model: ModelChoice, served: "ServedChoice", as_json: bool
) -> None:
    """compare --against-endpoint: the model here (A) beside the one a server runs (B), headless."""
    from tokenviz.backends.engines import engine_of
    from tokenviz.cli.table import print_served_comparison
    from tokenviz.files.documents import trace_document
    from tokenviz.journey.served_comparison import compare_with_server
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import snapshot_of

    try:
        journey = served.open(settings)  # (an unreachable server is told before A loads)
        with stderr_progress() as progress:
            session = Session(engine_of(model.load(progress)), settings)
        document = compare_with_server(session, journey, prompt)
    except TokenvizError as exc:
        fail(str(exc))
    document["a"] = trace_document(snapshot_of(session))  # (A's journey, as trace --json gives it)
    print_result(document, as_json, print_served_comparison)


def print_result(document: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any], Console], None]) -> None:
    """A headless command's document: strict JSON on stdout, or its table."""
    if as_json:
        print_document(document, as_json=True)
    else:
        table(document, Console())


def check_trace(
    steps: int,
    save: str | None,
    html: str | None,
    force: bool,
    beams: int | None,
    speculate: str | None,
    per_step: bool,
    attribution: str | None,
    watch: list[str] | None,
) -> None:
    """Refuse trace's options that cannot work together, in one line, before anything is loaded."""
    for path in (save, html):
        if path:
            check_writable(path, force)
    if steps < 1:
        raise TokenvizError(f"--steps must be at least 1, got {steps}")
    if beams is not None and not 2 <= beams <= 8:
        raise TokenvizError(f"--beams must be 2 to 8, got {beams}")
    if (beams or speculate) and (save or html or per_step or attribution or watch):
        raise TokenvizError(
            "--beams and --speculate cannot be combined with --save, --html, --lens, --routing, --attribution "
            "or --watch"
        )
    if attribution is not None and attribution not in ATTRIBUTION_METHODS:
        raise TokenvizError(f"--attribution must be loo or grad, got {attribution!r}")
    if beams and speculate:
        raise TokenvizError("choose --beams or --speculate, not both")


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


# ---- tokenviz score TEXT: how likely the model finds a text -----------------------------------------

score_cli = _typer()


@score_cli.command()
@grammar_options()
@model_options()
def score(
    model: ModelChoice,
    grammar: Grammar | None,
    text: Annotated[str, typer.Argument(help="The text to score.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    chat: Chat = False,
    system: System = None,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
) -> None:
    """Score a text: each token's log-probability, probability and rank, the entropy and top
    candidates there, the total log-probability and the perplexity (one forward pass). With a
    grammar (--json-schema, --regex, --grammar), which the text follows from its first token, each
    token's log-probability under it too (one more pass). With --endpoint, on the model a server runs
    (its prompt log-probabilities: no entropy, the server's top 5)."""
    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, takes_tokenizer=False)
    if served is not None:
        if grammar is not None or chat or model.model:
            fail(
                "score --endpoint takes no grammar, --chat or --model yet: the server's model scores the text as typed"
            )
        run_served_score(text, served, as_json)
        return
    from tokenviz.backends.engines import engine_of
    from tokenviz.backends.transformers.before_weights import journey_checks
    from tokenviz.cli.table import print_score
    from tokenviz.journey.score import score_text
    from tokenviz.journey.session import Session

    try:
        check_chat(chat, system)
        with stderr_progress() as progress:
            session = Session(engine_of(model.load(progress, journey_checks(grammar))))
            document = score_text(session, text, chat=chat, system=system, grammar=grammar)
    except TokenvizError as exc:
        fail(str(exc))
    if as_json:
        print_document(document, as_json=True)
    else:
        print_score(document, Console())


# ---- tokenviz compare PROMPT: two journeys side by side ------------------------------------------------

compare_cli = _typer()


@compare_cli.command()
@sampling_options(leave_out=("max_new_tokens",))
@model_options()
def compare(
    settings: SamplingSettings,
    model: ModelChoice,
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
    served = served_options(
        against_endpoint,
        served_model,
        api_key_env,
        api_key_file,
        insecure_http,
        url_option="--against-endpoint",
        takes_tokenizer=False,
    )
    if served is not None:
        others = (against, against_model, against_dtype, against_quantize, against_grammar, chat)
        if any(others) or settings.grammar is not None:
            fail("--against-endpoint compares the same settings on both sides: it takes no other --against option")
        compare_served(prompt, settings.replace(max_new_tokens=steps), model, served, as_json)
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

        return compare_sessions(a, b, model, b_model, progress)

    if as_json:
        from tokenviz.cli.headless import compare_document

        try:
            with stderr_progress() as progress:
                document = compare_document(build(progress), prompt, chat=chat, system=system, progress=progress)
        except TokenvizError as exc:
            fail(str(exc))
        print_document(document, as_json=True)
        return
    require_terminal()
    from tokenviz.worker.comparing import CompareWorker

    run_app(CompareWorker(build, prompt, chat=chat, system=system), theme, comparing=True)


# ---- tokenviz serve: the app in a browser ---------------------------------------------------------------

SERVE_OPTIONS = ("--host", "--port", "--max-sessions")  # serve's own: every other argument goes to the app
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_arguments(args: list[str]) -> list[str]:
    """`args` without serve's own options and their values: what each browser tab's app is given."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in SERVE_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in SERVE_OPTIONS)):
            out.append(arg)
    return out


serve_cli = _typer()


@serve_cli.command()
@sampling_options()
@model_options()
def serve(
    settings: SamplingSettings,
    model: ModelChoice,
    prompt: Annotated[Optional[str], typer.Argument(help="Text to start from (as for tokenviz).")] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on. Anyone who can reach it can drive the model: keep it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    max_sessions: Annotated[
        int,
        typer.Option(
            "--max-sessions",
            help="The most browser tabs served at once, each a process with its own model "
            "(0: as many as the memory available holds).",
        ),
    ] = 0,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
    tokenizer: LocalTokenizer = None,
) -> None:
    """The same app in a web browser (textual-serve): each tab gets its own journey, and closing the
    tab ends its process. Takes every option tokenviz takes (--endpoint too: each tab a client of the
    model's server)."""
    import shlex
    import socket

    try:
        check_theme(theme)
        check_chat(chat, system)
        if not 0 < port < 65536:
            raise TokenvizError(f"--port must be 1-65535, got {port}")
        if max_sessions < 0:
            raise TokenvizError(f"--max-sessions must be 1 or more (0: from the memory available), got {max_sessions}")
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except TokenvizError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, tokenizer)
    if served is not None:  # asked once here, as each tab will: an unreachable server is told now
        served_loader(model, settings, served)
    from tokenviz.cli.serving import LimitedServer, session_limit

    command = shlex.join([sys.executable, "-m", "tokenviz", *app_arguments(sys.argv[2:])])
    if host not in LOOPBACK:
        print_error(f"listening on {host}: anyone who can reach port {port} can drive the model")
    limit, why = session_limit(max_sessions, model.model, served=endpoint is not None)
    plural = "" if limit == 1 else "s"
    err.print(
        f"tokenviz in a browser: http://{host}:{port} · at most {limit} session{plural} at once ({why}) "
        "(ctrl+c stops it)",
        highlight=False,
    )
    LimitedServer(command, limit, host=host, port=port, title="tokenviz").serve()


# ---- tokenviz replay FILE: a saved journey ------------------------------------------------------

replay_cli = _typer()


@replay_cli.command()
@model_options()
def replay(
    model: ModelChoice,
    path: Annotated[str, typer.Argument(help="A journey saved with x in the app or trace --save.")],
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-run it with the model; exit 0 only if every token matches.")
    ] = False,
    theme: Theme = DEFAULT_THEME,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    api_key_env: ApiKeyEnv = None,
    api_key_file: ApiKeyFile = None,
    insecure_http: InsecureHttp = False,
    tokenizer: LocalTokenizer = None,
) -> None:
    """Open a saved journey read-only, without loading any model (or --verify it against the model,
    or against the server with --endpoint for a journey on a served model: with --tokenizer DIR where it
    was steered)."""
    from tokenviz.files.journey_file import open_journey, recording_of

    served = served_options(endpoint, served_model, api_key_env, api_key_file, insecure_http, tokenizer)
    try:
        journey = open_journey(path)
        if verify and (served is not None or journey.replay.info.top_only):
            verify_served_recording(journey, served, tokenizer)
            return
        if served is not None:
            raise TokenvizError("--endpoint goes with --verify: a replay without it loads no model")
        if verify:
            verify_recording(journey, model)
            return
        recording = recording_of(journey)
        check_theme(theme)
    except TokenvizError as exc:
        fail(str(exc))
    require_terminal()
    from tokenviz.worker.recording import RecordingWorker

    run_app(RecordingWorker(*recording), theme)


def verify_served_recording(journey: "Journey", served: "ServedChoice | None", tokenizer: str | None = None) -> None:
    """Re-run a journey recorded on a served model against `served` (the server): its tokens, and each
    chosen token's log-probability within the served tolerance, for those are all the file holds.
    `tokenizer`: --tokenizer (the model's directory gives the head a steered journey needs)."""
    from tokenviz.backends.engines import engine_of
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.journey.session import Session
    from tokenviz.served.journey import REPRODUCED_WITHIN

    recorded = journey.replay.info
    if served is None:
        raise TokenvizError(
            f"the journey was recorded on {recorded.name}, {recorded.device}: verify it against the server "
            "with --endpoint URL (and --api-key-env VAR or --api-key-file FILE)"
        )
    if not recorded.top_only:
        raise TokenvizError("the journey was recorded on a model run here: verify it without --endpoint")
    engine = ServedEngine.open(served, tokenizer)
    checked, mismatch = verify_journey(journey, Session(engine_of(engine)), REPRODUCED_WITHIN)
    verdict(
        checked,
        mismatch,
        len(journey.steps),
        f"its token, or its log-probability by more than {REPRODUCED_WITHIN:g} nats",
        "tokens and log-probabilities",
    )


def verdict(checked: int, mismatch: int | None, steps: int, differs: str, reproduced: str, other: str = "") -> None:
    """A verification's one line: the step that differs (exit 1), or all reproduced."""
    if mismatch is not None:
        err.print(
            f"mismatch: step {mismatch} differs from the recording ({differs}; {checked} of {steps} steps checked)"
            + other,
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    typer.echo(f"verified: all {checked} steps reproduce the recorded {reproduced}")


def verify_recording(journey: "Journey", model: ModelChoice) -> None:
    """Re-run a recording with the model; exit 1 at the first token that differs. Without --model, the
    model the journey names (the bundled one, a path, a hub id); with it, a line where they differ."""
    from tokenviz.backends.engines import engine_of
    from tokenviz.backends.transformers.loading import BUNDLED_NAME
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.journey.session import Session

    recorded = journey.replay.info.name
    if model.model is None and recorded != BUNDLED_NAME:
        if recorded.endswith(".gguf") and not Path(recorded).expanduser().is_file():
            raise TokenvizError(f"the journey was recorded on {recorded}, which is not here: name it with --model")
        model = dataclasses.replace(model, model=recorded)
        err.print(f"verifying on {recorded}, the model the journey was recorded on", markup=False, highlight=False)
    with stderr_progress() as progress:
        loaded = model.load(progress)
    differs = loaded.info.name != recorded
    if differs:
        err.print(
            f"note: the journey was recorded on {recorded}; verifying on {loaded.info.name}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    checked, mismatch = verify_journey(journey, Session(engine_of(loaded)))
    other = f" (recorded on another model: {recorded})" if differs else ""
    verdict(checked, mismatch, len(journey.steps), "its token, or the experts it was routed to", "tokens", other)


SUBCOMMANDS = {"trace": trace_cli, "replay": replay_cli, "score": score_cli, "compare": compare_cli, "serve": serve_cli}


def run() -> None:
    """Entry point: `tokenviz trace|replay|score|compare|serve ...` go to their own commands, everything
    else to the app."""
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        command(SUBCOMMANDS[args[0]], args[1:], f"tokenviz {args[0]}")
    else:
        command(app_cli, args, "tokenviz")


def command(cli: typer.Typer, args: list[str], name: str) -> NoReturn:
    """Run `cli` on `args`; a mistyped option or argument is one line (click's usage box was three,
    and a box), with the way to the options."""
    try:
        code = cli(args=args, prog_name=name, standalone_mode=False)
    except Exception as exc:  # (click's exceptions: vendored inside typer by its newer releases)
        if type(exc).__name__ == "Abort":  # ctrl+c before the command's own handling began
            print_error("aborted")
            raise SystemExit(1) from None
        message = getattr(exc, "format_message", None)
        if message is None or getattr(exc, "exit_code", None) != USAGE_ERROR:
            raise
        print_error(f"{message()} (see {name} --help)")
        raise SystemExit(USAGE_ERROR) from None
    raise SystemExit(code if isinstance(code, int) else 0)
