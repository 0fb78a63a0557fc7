"""A backend as a plugin: what it is called, the options it declares, and how it opens an engine.

Each backend registers one `Backend` under the entry-point group `tokenviz.backends` (the built-in ones
in tokenviz's pyproject.toml; a separate package adds its own the same way). The command line is built
from them (tokenviz.cli.backend_options): every option a backend declares, under its name in `--help`,
on the commands it names; `--backend NAME` chooses one, or a backend's own option does (`asked`). The
chosen backend's `loader` checks what it was given (one line where something is wrong, before anything
loads) and returns what the worker calls in its thread to make the model: the least a backend gives (a
Stepping, contract.stepping) or a whole engine (contract.engine).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from tokenviz.contract.engine import Engine
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.stepping import DrawingModel, Stepping

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)
OpenModel = Callable[
    [Progress], "Engine | Stepping | DrawingModel"
]  # what a loader returns: called in the worker's thread
OpenEngine = Callable[[Progress], Engine]  # the same, the model made an Engine (tokenviz.journey.stepped_engine)
COMMANDS = frozenset(
    {"app", "trace", "score", "serve", "replay", "sae-train", "sae-index"}
)  # the commands that open a model
WITH_COMPARE = COMMANDS | {"compare"}  # and compare, which opens one for each side (an option of A's or B's)
OptionKind = Literal["text", "flag", "number", "texts"]  # texts: a text given as often as wanted
OptionValue = str | bool | int | tuple[str, ...] | None


@dataclass(frozen=True)
class BackendOption:
    """One command-line option a backend declares: `--name-with-dashes`, a text (None unless given), a
    flag, a whole number (None unless given) or texts (repeatable: () unless given), on the `commands`
    named."""

    name: str  # a Python name: api_key_env is --api-key-env
    help: str
    kind: OptionKind = "text"
    commands: frozenset[str] = COMMANDS

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Opening:
    """What a command asks a backend to open: its own options' values (by name, every one, None, False
    or () where not given), which of them were given, the model `--model` names (every backend's option:
    None for the bundled model), the sampling settings the journey starts with, and the command."""

    command: str
    values: Mapping[str, OptionValue]
    given: frozenset[str]
    model: str | None
    settings: SamplingSettings
    interventions: tuple[Intervention, ...] = ()  # in force from the prompt on (a backend checks it can run them)
    warn: Callable[[str], None] = lambda line: None  # a warning to the user (a key file others can read)

    def text(self, name: str) -> str | None:
        """The text option `name` was given (None where it was not)."""
        value = self.values.get(name)
        return value if isinstance(value, str) else None

    def number(self, name: str) -> int | None:
        """The whole number option `name` was given (None where it was not)."""
        value = self.values.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def flag(self, name: str) -> bool:
        return self.values.get(name) is True

    def texts(self, name: str) -> tuple[str, ...]:
        """The texts a repeatable option `name` was given (() where it was not)."""
        value = self.values.get(name)
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, tuple) else ()


class Backend(Protocol):
    """A backend: its name (as --backend takes it), one line about it, its options, whether a command
    line asks for it without --backend, and how it opens an engine."""

    name: str
    about: str
    weights_here: bool  # the model's weights are in this process (each browser tab of `serve` holds them)
    draws: bool  # its engine draws each token itself (a server): compare sets it as B, over the top N it gives
    options: tuple[BackendOption, ...]

    def asked(self, given: frozenset[str]) -> bool:
        """Whether these options of its own, given, choose it (a server's --endpoint does)."""

    def loader(self, opening: Opening) -> OpenModel:
        """Check `opening` (a TokenvizError of one line where something does not apply) and return what
        makes the model in the worker's thread: a Stepping (contract.stepping) or a whole Engine."""
