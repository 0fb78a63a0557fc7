"""The options the commands share, each declared once, and the one-line failure every foreseeable
mistake ends with (exit code 2, never a traceback).

The sampling options come from SamplingSettings itself (its defaults are the only ones) and reach
a command as one validated `settings` argument.
"""

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.text import Text

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import DEFAULT_SETTINGS, SamplingSettings
from tokenviz.contract.text import safe_text

err = Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """One line on stderr. The message is plain text: brackets in it are not Rich markup."""
    err.print(Text.assemble(("error:", "bold red"), " ", safe_text(message)), soft_wrap=True)


def fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(2)


Model = Annotated[
    Optional[str],
    typer.Option(
        "--model", "-m", help="Hugging Face id, local model directory or .gguf path. Default: the bundled SmolLM2-135M."
    ),
]
Device = Annotated[str, typer.Option(help="auto (GPU if there is one), cpu, cuda or mps.")]
Dtype = Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow a model's own Python code to run.")]
Chat = Annotated[
    bool,
    typer.Option("--chat", help="The prompt is a user message, put through the model's chat template."),
]
System = Annotated[Optional[str], typer.Option("--system", help="With --chat: a system message before it.")]

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


def sampling_options(*, leave_out: tuple[str, ...] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command every sampling option (but `leave_out`); it receives them as `settings`.

    A value out of range ends the command with one line and exit code 2.
    """
    names = [name for name in SAMPLING_OPTIONS if name not in leave_out]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "settings"]
        added = []
        for name in names:
            kind, option = SAMPLING_OPTIONS[name]
            default = getattr(DEFAULT_SETTINGS, name)
            added.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=Annotated[kind, option],
                    default=list(default) or None if name == "stop" else default,
                )
            )

        @functools.wraps(command)
        def with_settings(**kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in names}
            values["stop"] = tuple(values.get("stop") or ())
            try:
                settings = SamplingSettings(**values)
            except TokenvizError as exc:
                fail(str(exc))
            command(settings=settings, **kwargs)

        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
        with_settings.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_settings.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_settings

    return decorate


@contextlib.contextmanager
def stderr_progress() -> Iterator[Callable[[str, "float | None"], None]]:
    """A progress reporter for model loading: a bar while converting, a dim line otherwise."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err, transient=True
    ) as bar:
        task = None

        def report(message: str, fraction: float | None) -> None:
            nonlocal task
            if fraction is None:
                err.print(Text(safe_text(message), style="dim"), soft_wrap=True)
                return
            if task is None:
                task = bar.add_task(message, total=1.0)
            bar.update(task, completed=fraction, description=message)

        yield report
