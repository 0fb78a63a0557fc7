"""Command line: `tokenviz [PROMPT]` opens the app; `tokenviz trace PROMPT` runs the journey headless.

Every foreseeable mistake ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from tokenviz import __version__
from tokenviz.errors import TokenvizError

DEFAULT_PROMPT = "The Eiffel Tower is located in"
SUBCOMMANDS = ("trace", "replay")

err = Console(stderr=True, highlight=False)


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(2)


# ---- options shared by the app and the trace ---------------------------------------------------

Model = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Hugging Face id, local model directory or .gguf path. Default: the bundled SmolLM2-135M.")]
Device = Annotated[str, typer.Option(help="auto (GPU if there is one), cpu, cuda or mps.")]
Dtype = Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow a model's own Python code to run.")]
Temperature = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="0 = off.")]
TopP = Annotated[float, typer.Option("--top-p", help="1.0 = off.")]
MinP = Annotated[float, typer.Option("--min-p", help="0 = off.")]
RepetitionPenalty = Annotated[float, typer.Option(help="1.0 = off.")]
PresencePenalty = Annotated[float, typer.Option(help="0 = off.")]
FrequencyPenalty = Annotated[float, typer.Option(help="0 = off.")]
Seed = Annotated[int, typer.Option(help="Seed of the draws: same seed and settings, same journey.")]
Stop = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")]


def make_settings(**kwargs):
    from tokenviz.settings import SamplingSettings

    kwargs["stop"] = tuple(kwargs.get("stop") or ())
    return SamplingSettings(**kwargs)


@contextlib.contextmanager
def stderr_progress():
    """A progress reporter for model loading: a bar while converting, a dim line otherwise."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = None

        def report(message: str, fraction: float | None) -> None:
            nonlocal task
            if fraction is None:
                err.print(f"[dim]{message}[/]", soft_wrap=True)
                return
            if task is None:
                task = bar.add_task(message, total=1.0)
            bar.update(task, completed=fraction, description=message)

        yield report


def check_theme(name: str) -> None:
    from tokenviz.themes import load_themes

    themes = load_themes()
    if name not in themes:
        fail(f"unknown theme {name!r}; available: {', '.join(sorted(themes))}")


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tokenviz {__version__}")
        raise typer.Exit()


# ---- tokenviz [PROMPT]: the app ------------------------------------------------------------------

app_cli = typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)


@app_cli.command(epilog="Headless: [bold]tokenviz trace PROMPT --steps N [--json][/]  (tokenviz trace --help)")
def open_app(
    prompt: Annotated[Optional[str], typer.Argument(help="Text to start from.")] = None,
    model: Model = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    trust_remote_code: TrustRemoteCode = False,
    temperature: Temperature = 0.7,
    top_k: TopK = 50,
    top_p: TopP = 0.9,
    min_p: MinP = 0.0,
    repetition_penalty: RepetitionPenalty = 1.0,
    presence_penalty: PresencePenalty = 0.0,
    frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = 0,
    max_new_tokens: Annotated[int, typer.Option(help="Autoplay stops after this many tokens.")] = 256,
    stop: Stop = None,
    theme: Annotated[str, typer.Option(help="Colour theme (see themes/).")] = "tokenviz-dark",
    version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """Watch a language model think, one token at a time."""
    try:
        settings = make_settings(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed, max_new_tokens=max_new_tokens, stop=stop,
        )
        from tokenviz.app import TokenvizApp

        check_theme(theme)
    except TokenvizError as exc:
        fail(str(exc))
    app = TokenvizApp(
        prompt=prompt if prompt is not None else DEFAULT_PROMPT,
        model=model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
        settings=settings, theme=theme,
    )
    app.run()
    if app.fatal_error:
        fail(app.fatal_error)


# ---- tokenviz trace PROMPT: headless ------------------------------------------------------------

trace_cli = typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)


@trace_cli.command()
def trace(
    prompt: Annotated[str, typer.Argument(help="Text to start from.")],
    steps: Annotated[int, typer.Option(help="How many tokens to generate.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    lens: Annotated[bool, typer.Option("--lens", help="Add each step's logit lens (every layer's top tokens).")] = False,
    save: Annotated[Optional[str], typer.Option("--save", help="Also write the replayable journey to this .json file.")] = None,
    beams: Annotated[Optional[int], typer.Option("--beams", help="Beam search of this width (2-8) instead of sampling.")] = None,
    speculate: Annotated[Optional[str], typer.Option(
        "--speculate", help="Speculative decoding: prompt-lookup, early-exit:LAYER or draft-model.")] = None,
    draft_model: Annotated[Optional[str], typer.Option("--draft-model", help="The drafter for --speculate draft-model.")] = None,
    model: Model = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    trust_remote_code: TrustRemoteCode = False,
    temperature: Temperature = 0.7,
    top_k: TopK = 50,
    top_p: TopP = 0.9,
    min_p: MinP = 0.0,
    repetition_penalty: RepetitionPenalty = 1.0,
    presence_penalty: PresencePenalty = 0.0,
    frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = 0,
    stop: Stop = None,
) -> None:
    """Run the journey headless and print every step (a table, or JSON with --json)."""
    from tokenviz.trace import run_trace, print_table

    try:
        if steps < 1:
            raise TokenvizError(f"--steps must be at least 1, got {steps}")
        if beams is not None and not 2 <= beams <= 8:
            raise TokenvizError(f"--beams must be 2 to 8, got {beams}")
        if (beams or speculate) and (save or lens):
            raise TokenvizError("--beams and --speculate cannot be combined with --save or --lens")
        if beams and speculate:
            raise TokenvizError("choose --beams or --speculate, not both")
        if draft_model and not speculate:
            speculate = "draft-model"
        settings = make_settings(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed, max_new_tokens=steps, stop=stop,
        )
        with stderr_progress() as progress:
            document = run_trace(
                prompt, settings, model=model, device=device, dtype=dtype,
                trust_remote_code=trust_remote_code, progress=progress, lens=lens, save=save, beams=beams,
                speculate=speculate, draft_model=draft_model,
            )
    except TokenvizError as exc:
        fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
    else:
        print_table(document, Console())


# ---- tokenviz replay FILE: a saved journey ------------------------------------------------------

replay_cli = typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)


@replay_cli.command()
def replay(
    path: Annotated[str, typer.Argument(help="A journey saved with x in the app or trace --save.")],
    verify: Annotated[bool, typer.Option("--verify", help="Re-run it with the model; exit 0 only if every token matches.")] = False,
    model: Model = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    trust_remote_code: TrustRemoteCode = False,
    theme: Annotated[str, typer.Option(help="Colour theme.")] = "tokenviz-dark",
) -> None:
    """Open a saved journey read-only, without loading any model (or --verify it against the model)."""
    from tokenviz.journey import read_journey, snapshot_from_journey

    try:
        doc = read_journey(path)
        if verify:
            from tokenviz.engine import ModelRunner, load_model
            from tokenviz.journey import verify_journey
            from tokenviz.session import Session

            with stderr_progress() as progress:
                loaded = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                    progress=progress)
            checked, mismatch = verify_journey(doc, Session(ModelRunner(loaded)))
            if mismatch is not None:
                err.print(f"[bold red]mismatch:[/] step {mismatch} differs from the recording "
                          f"({checked} of {len(doc['steps'])} steps checked)", soft_wrap=True)
                raise typer.Exit(1)
            typer.echo(f"verified: all {checked} steps reproduce the recorded tokens")
            return
        snapshot = snapshot_from_journey(doc)
        check_theme(theme)
    except TokenvizError as exc:
        fail(str(exc))
    from functools import partial

    from tokenviz.app import TokenvizApp
    from tokenviz.bridge import FrozenBridge

    TokenvizApp(prompt=snapshot.prompt, theme=theme, loader=lambda progress: None,
                bridge_factory=partial(FrozenBridge, snapshot=snapshot)).run()


def run() -> None:
    """Entry point: route `trace` and `replay` to their own commands, everything else to the app."""
    args = sys.argv[1:]
    if args and args[0] == "trace":
        trace_cli(args=args[1:], prog_name="tokenviz trace")
    elif args and args[0] == "replay":
        replay_cli(args=args[1:], prog_name="tokenviz replay")
    else:
        app_cli(args=args, prog_name="tokenviz")
