"""The backends' options on the command line: `--backend NAME` and every option each registered backend
declares (contract.backend), under the backend's name in `--help`, on the commands it names. A command
receives them as one `BackendChoice` and asks it for the chosen backend's loader: no command names a
backend."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import typer

from tokenviz.backends.registry import choose_backend, registered_backends
from tokenviz.cli.options import MODEL_OPTION, option_group, print_warning, sampling_options
from tokenviz.contract.backend import Backend, BackendOption, OpenEngine, Opening, OptionValue, Progress
from tokenviz.contract.engine import Engine
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import is_count, safe_text, shortened

NAME = "backend_name"  # --backend's value among the options (`backend` is the command's argument)
MODEL = "model"  # --model's: every backend takes it
KINDS: dict[str, Any] = {"text": Optional[str], "flag": bool, "number": Optional[int], "texts": Optional[list[str]]}
UNGIVEN: dict[str, OptionValue] = {"text": None, "flag": False, "number": None, "texts": ()}
BACKEND_HELP = (
    "Which runtime computes the model's numbers: {names} (default: transformers, or the one whose option is given)."
)


@dataclass(frozen=True)
class BackendChoice:
    """The backend options of a command line: `--backend`, `--model` and every backend option's value,
    and which were given."""

    command: str
    values: dict[str, Any]
    given: frozenset[str]

    @property
    def model(self) -> str | None:
        """The model --model names (None: the bundled one)."""
        model = self.values.get(MODEL)
        return model if isinstance(model, str) else None

    def with_values(self, **values: OptionValue) -> BackendChoice:
        """This choice with these options given these values (compare's B, a draft model)."""
        given = self.given | {name for name, value in values.items() if value not in (None, False, ())}
        return dataclasses.replace(self, values={**self.values, **values}, given=given)

    def __getattr__(self, name: str) -> Any:  # option_group reads each option's default so
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def flags(self) -> list[str]:
        """The backend options given, as typed (--backend, --model, --endpoint...)."""
        return sorted("--backend" if name == NAME else "--" + name.replace("_", "-") for name in self.given)

    def sides(self, against: str | None) -> tuple[BackendChoice, BackendChoice]:
        """compare's two sides: A on --backend's, B on `against` (None: A's); each counts as given only the
        options its own backend takes, so neither refuses the other's."""
        if against is None:
            return self, self
        table = registered_backends()
        if against not in table:
            raise TokenvizError(f"--against-backend {against!r}: the backends here are {', '.join(table)}")
        b_own = {o.name for o in table[against].options}
        a_side = dataclasses.replace(self, given=self.given - b_own)
        a_own = {o.name for o in a_side.backend().options}
        b_given = (self.given - {NAME} - (a_own - b_own)) | {NAME}
        return a_side, dataclasses.replace(self, values={**self.values, NAME: against}, given=b_given)

    def backend(self) -> Backend:
        """The backend chosen (one line, a TokenvizError, where the options given do not go together)."""
        return choose_backend(self.values.get(NAME), self.given - {NAME, MODEL})

    def loader(self, settings: SamplingSettings, interventions: tuple[Intervention, ...] = ()) -> OpenEngine:
        """The chosen backend's loader, what it was given checked first."""
        backend = self.backend()
        own = {o.name: o for o in backend.options}
        values = {name: self._value(option) for name, option in own.items()}
        given = self.given & set(own)
        opening = Opening(self.command, values, given, self.model, settings, interventions, warn=print_warning)
        opens = backend.loader(opening)

        def opened(progress: Progress) -> Engine:
            """The engine, its description made safe to print (a plugin's is its own text)."""
            from tokenviz.journey.stepped_engine import as_engine  # in the worker's thread: it imports torch

            engine = as_engine(opens(progress))
            with contextlib.suppress(AttributeError):  # an engine whose info cannot be set keeps its own
                engine.info = engine.info.made_safe()
            return engine

        return opened

    def _value(self, option: BackendOption) -> OptionValue:
        value = self.values.get(option.name)
        if value is None or (option.kind == "flag" and value is False):
            return UNGIVEN[option.kind]
        return tuple(value) if isinstance(value, list | tuple) else value


FLAG_WORDS = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def option_values(backend: Backend, assignments: Sequence[str], given_as: str) -> dict[str, OptionValue]:
    """`NAME=VALUE` assignments of `backend`'s own options (a flag's VALUE on/off, a number's a whole number,
    a repeatable option's each given again), for compare's B (`given_as`: the option that gave them); one
    line naming the backend's options for a NAME it does not declare or a VALUE that is not the kind."""
    own = {o.name: o for o in backend.options}
    names = ", ".join(o.flag.removeprefix("--") for o in backend.options) or "none"
    values: dict[str, OptionValue] = {}
    for assignment in assignments:
        name, equals, value = assignment.partition("=")
        key = name.strip().removeprefix("--").replace("-", "_")
        option = own.get(key)
        if not equals or option is None:
            said = safe_text(shortened(assignment, 40))
            raise TokenvizError(f"{given_as} {said!r}: give NAME=VALUE of an option of {backend.name}'s: {names}")
        if option.kind == "number":
            if not is_count(value.strip()):
                raise TokenvizError(f"{given_as} {option.flag}: give a whole number, not {safe_text(value)!r}")
            values[key] = int(value)
        elif option.kind == "flag":
            if value.strip().lower() not in FLAG_WORDS:
                raise TokenvizError(f"{given_as} {option.flag}: give on or off, not {safe_text(value)!r}")
            values[key] = FLAG_WORDS[value.strip().lower()]
        elif option.kind == "texts":
            earlier = values.get(key)
            values[key] = (*(earlier if isinstance(earlier, tuple) else ()), value)
        else:
            values[key] = value
    return values


_left_out: dict[tuple[str, str], list[str]] = {}  # (backend, flag) -> the commands that have that option already


def left_out() -> list[str]:
    """A line for each backend option left out of commands that have an option of its name already."""
    return [
        f"the {backend} backend's option {flag} is left out: tokenviz {', '.join(commands)} "
        f"{'has' if len(commands) == 1 else 'have'} an option of that name"
        for (backend, flag), commands in _left_out.items()
    ]


def _names_taken(function: Callable[..., None]) -> set[str]:
    """The names and flags `function`'s command line has already: a backend's option may take none."""
    taken = {NAME, "backend", "--backend", "--help", MODEL, "--model", "-m"}
    for parameter in inspect.signature(function, eval_str=True).parameters.values():
        taken |= {parameter.name, "--" + parameter.name.replace("_", "-")}
        for meta in getattr(parameter.annotation, "__metadata__", ()):
            taken |= set(getattr(meta, "param_decls", None) or ())
            taken |= {meta.default} if isinstance(getattr(meta, "default", None), str) else set()
    return taken


def backend_options(command: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give `command` --backend and the registered backends' options for it; it receives them as
    `backend` (a BackendChoice). An option whose name or flag the command has already (a plugin's named
    `model`, `steps`...) is left out with a line (left_out), and the built-in one kept."""
    table = registered_backends()

    def decorate(function: Callable[..., None]) -> Callable[..., None]:
        taken = _names_taken(function)
        options: dict[str, tuple[Any, Any]] = {
            NAME: (Optional[str], typer.Option("--backend", help=BACKEND_HELP.format(names=", ".join(table)))),
            MODEL: MODEL_OPTION,
        }
        defaults: dict[str, Any] = {NAME: None, MODEL: None}
        for backend in table.values():
            for option in backend.options:
                if command not in option.commands:
                    continue
                if option.name in taken or option.flag in taken:
                    _left_out.setdefault((backend.name, option.flag), []).append(command)
                    continue
                if option.name in options:  # another backend's of that name: one option for both
                    continue
                panel = f"{backend.name} backend"
                options[option.name] = (
                    KINDS[option.kind],
                    typer.Option(option.flag, help=option.help, rich_help_panel=panel),
                )
                defaults[option.name] = UNGIVEN[option.kind]

        def make(values: dict[str, Any], given: frozenset[str]) -> BackendChoice:
            return BackendChoice(command, {**defaults, **values}, given)

        return option_group("backend", options, make)(function)

    return decorate


def journey_options(
    command: str, leave_out: tuple[str, ...] = ()
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """What every command that runs a journey takes: --model, the backend and its options (`backend`) and
    the sampling settings but `leave_out` (`settings`)."""

    def decorate(function: Callable[..., None]) -> Callable[..., None]:
        return backend_options(command)(sampling_options(leave_out=leave_out)(function))

    return decorate
