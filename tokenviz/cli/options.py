"""The options the commands share, each declared once, and the one-line failure every foreseeable
mistake ends with (exit code 2, never a traceback).

The sampling options come from SamplingSettings itself (its defaults are the only ones) and reach
a command as one validated `settings` argument; --model and the backends' options reach it as one
`backend` argument (tokenviz.cli.backend_options).
"""

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.text import Text

from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.presets import PRESETS, preset_named
from tokenviz.contract.settings import DEFAULT_SETTINGS, SamplingSettings
from tokenviz.contract.snapshot import CANCELS
from tokenviz.contract.text import safe_text

if TYPE_CHECKING:
    from tokenviz.contract.grammar import Grammar

err = Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """One line on stderr. The message is plain text: brackets in it are not Rich markup."""
    err.print(Text.assemble(("error:", "bold red"), " ", safe_text(message)), soft_wrap=True)


def print_warning(message: str) -> None:
    """One line on stderr that lets the command go on."""
    err.print(Text.assemble(("warning:", "bold yellow"), " ", safe_text(message)), soft_wrap=True)


def fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(2)


MODEL_OPTION = (
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Hugging Face id, local model directory or .gguf path (as the backend takes it). Default: the "
        "bundled SmolLM2-135M.",
    ),
)
Chat = Annotated[
    bool,
    typer.Option("--chat", help="The prompt is a user message, put through the model's chat template."),
]
System = Annotated[Optional[str], typer.Option("--system", help="With --chat: a system message before it.")]
LensLayersOption = Annotated[
    Optional[str],
    typer.Option(
        "--lens-layers",
        help="The logit lens's rows, as emb,0-29/4,last (emb, last, N, N-M, N-M/K; layers from 0; all by "
        "default). A served model's lens then asks its server for those layers alone.",
    ),
]
# Each SamplingSettings field as a command-line option: (type, typer.Option).
SAMPLING_OPTIONS: dict[str, tuple[Any, Any]] = {
    "temperature": (float, typer.Option("--temperature", "-t", help="0 = greedy.")),
    "top_k": (int, typer.Option("--top-k", help="0 = off.")),
    "top_p": (float, typer.Option("--top-p", help="1.0 = off.")),
    "min_p": (float, typer.Option("--min-p", help="0 = off.")),
    "repetition_penalty": (float, typer.Option(help="1.0 = off.")),
    "presence_penalty": (float, typer.Option(help="0 = off.")),
    "frequency_penalty": (float, typer.Option(help="0 = off.")),
    "seed": (int, typer.Option(help="Seed of the draws: same seed and settings, same journey.")),
    "max_new_tokens": (int, typer.Option(help="Autoplay stops after this many tokens.")),
    "stop": (Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")),
}
# The grammar the generated text must follow (SamplingSettings.grammar): one of these, by its kind.
GRAMMAR_OPTIONS: dict[str, tuple[Any, Any]] = {
    "json_schema": (Optional[str], typer.Option("--json-schema", help="FILE: the text must be JSON valid under it.")),
    "regex": (Optional[str], typer.Option("--regex", help="PATTERN: the text must match this regular expression.")),
    "grammar": (Optional[str], typer.Option("--grammar", help="FILE: an EBNF grammar (GBNF or Lark) it follows.")),
}
GRAMMAR_KIND_OF_OPTION = {"json_schema": "json-schema", "regex": "regex", "grammar": "grammar"}


def grammar_of(values: dict[str, Any]) -> "Grammar | None":
    """The grammar one of the GRAMMAR_OPTIONS gives (read and checked), or None."""
    given = {name: value for name, value in values.items() if value is not None}
    if len(given) > 1:
        raise SettingsError("give one grammar: --json-schema, --regex or --grammar")
    for name, value in given.items():
        from tokenviz.files.grammar_file import read_grammar  # the engine loads only when asked

        return read_grammar(GRAMMAR_KIND_OF_OPTION[name], value)  # type: ignore[arg-type]
    return None


GIVEN = "option_group_context"  # the parameter through which a group learns which options were given


def option_group(
    argument: str, options: dict[str, tuple[Any, Any]], make: Callable[[dict[str, Any], frozenset[str]], Any]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command every option of a group (declared once, in `options`, with the defaults of
    what `make` builds); it receives them as one `argument`. `make` is told the values and which
    options were given on the command line. A value `make` refuses ends the command with one line and
    exit code 2."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != argument]
        defaults = make({}, frozenset())
        adds_context = GIVEN not in {p.name for p in own}  # one parameter, however many groups
        added = []
        for name, (kind, option) in options.items():
            default = getattr(defaults, name, None)
            added.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=Annotated[kind, option],
                    default=list(default) or None if isinstance(default, tuple) else default,
                )
            )

        @functools.wraps(command)
        def with_group(**kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in options}
            context = kwargs.pop(GIVEN) if adds_context else kwargs[GIVEN]  # the innermost group's to take
            given = frozenset(n for n in options if getattr(context.get_parameter_source(n), "name", "") != "DEFAULT")
            try:
                group = make(values, given)
            except TokenvizError as exc:
                fail(str(exc))
            command(**{argument: group}, **kwargs)

        context = [inspect.Parameter(GIVEN, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added + context * adds_context
        with_group.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_group.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_group

    return decorate


PRESET_OPTION = (
    Optional[str],
    typer.Option(
        "--preset",
        help="A task's settings, as the source texts give them: "
        + "; ".join(f"{p.name} ({p.task}: {p.summary})" for p in PRESETS)
        + ". An option given beside it wins.",
    ),
)


def sampling_options(*, leave_out: tuple[str, ...] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command every sampling option (but `leave_out`), --preset and the grammar options; it
    receives them as `settings`."""
    options = {name: option for name, option in SAMPLING_OPTIONS.items() if name not in leave_out}
    options["preset"] = PRESET_OPTION
    options.update(GRAMMAR_OPTIONS)

    def make(values: dict[str, Any], given: frozenset[str]) -> SamplingSettings:
        if not values:
            return DEFAULT_SETTINGS
        preset = values.pop("preset", None)
        if preset is not None:  # its settings, but where an option was given
            values |= {k: v for k, v in preset_named(preset).fields.items() if k in values and k not in given}
        grammar = grammar_of({name: values.pop(name, None) for name in GRAMMAR_OPTIONS})
        return SamplingSettings(**{**values, "stop": tuple(values.get("stop") or ()), "grammar": grammar})

    return option_group("settings", options, make)


def grammar_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the grammar options alone; it receives them as `grammar` (a Grammar or None)."""
    return option_group("grammar", GRAMMAR_OPTIONS, lambda values, given: grammar_of(values) if values else None)


@contextlib.contextmanager
def stderr_progress() -> Iterator[Callable[[str, "float | None"], None]]:
    """A progress reporter: a bar for work that knows its fraction (converting, prefilling, stepping),
    a dim line otherwise. Where stderr is no terminal (a script, a log), each message is one line,
    once, and a job with a fraction says only its end: no bar to redraw, no line per step."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with contextlib.ExitStack() as stack:
        bar, task, said = None, None, None

        def report(message: str, fraction: float | None) -> None:
            nonlocal bar, task, said
            message = message.replace(f" {CANCELS}", "")  # the app's key: a command here stops on Ctrl+C
            if fraction is None or not err.is_terminal:
                if fraction is not None and fraction < 1.0:  # a log gets a job's end, not each of its steps
                    return
                if message != said:
                    err.print(Text(safe_text(message), style="dim"), soft_wrap=True)
                said = message
                return
            if bar is None:
                columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
                bar = stack.enter_context(Progress(*columns, console=err, transient=True))
            if task is None:
                task = bar.add_task(message, total=1.0)
            bar.update(task, completed=fraction, description=message)

        yield report
