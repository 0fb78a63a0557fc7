"""The backends registered (contract.backend: each a plugin, found through the entry-point group
`tokenviz.backends`), which one a command line chooses.

A plugin is another package's code, run as the command line is built: one that fails to import, raises
(SystemExit too), is not a backend, or takes a built-in backend's name is left out with one line naming
it and its package (`refused`), and every command goes on with the rest."""

from __future__ import annotations

import functools
import keyword
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from tokenviz.contract.backend import Backend, BackendOption
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text, shortened

GROUP = "tokenviz.backends"
DEFAULT = "transformers"
OWN = "tokenviz"  # the distribution whose entry points are the built-in backends
NAME_CHARS = 40  # a backend's or option's name, at most


def _package(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return safe_text(shortened(str(getattr(dist, "name", None) or "an unknown package"), 60))


def _why_not_a_backend(backend: Any) -> str | None:
    """What the object an entry point names lacks to be a backend (contract.backend.Backend), or None."""
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name.isprintable() or not 0 < len(name) <= NAME_CHARS:
        return "it is not a backend (no name of printable text)"
    flags = (getattr(backend, flag, None) for flag in ("weights_here", "draws"))
    if not isinstance(getattr(backend, "about", None), str) or not all(isinstance(f, bool) for f in flags):
        return "it is not a backend (no line about it, or no weights_here and draws flags)"
    if not (callable(getattr(backend, "asked", None)) and callable(getattr(backend, "loader", None))):
        return "it is not a backend (no asked() or loader())"
    options = getattr(backend, "options", None)
    if not isinstance(options, tuple) or not all(isinstance(o, BackendOption) for o in options):
        return "its options are not a tuple of BackendOption"
    for option in options:
        named = isinstance(option.name, str) and option.name.isidentifier() and option.name.isascii()
        if not named or keyword.iskeyword(option.name):
            return f"its option {safe_text(shortened(repr(option.name), NAME_CHARS))} is not a Python name"
    return None


def _loaded(point: EntryPoint) -> Backend:
    """The backend `point` names, or a TokenvizError saying why it is none."""
    try:
        backend: Backend = point.load()
    except (Exception, SystemExit) as exc:  # another package's import: anything at all
        why = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenvizError(f"it failed to load: {safe_text(shortened(why, 160))}") from None
    lacking = _why_not_a_backend(backend)
    if lacking is not None:
        raise TokenvizError(lacking)
    return backend


@functools.cache
def _registry() -> tuple[dict[str, Backend], list[str]]:
    found: dict[str, Backend] = {}
    refused: list[str] = []
    points = sorted(entry_points(group=GROUP), key=lambda p: (_package(p) != OWN, p.name != DEFAULT, p.name))
    for point in points:
        plugin = f"the backend plugin {safe_text(shortened(point.name, NAME_CHARS))!r} of {_package(point)}"
        try:
            backend = _loaded(point)
        except TokenvizError as exc:
            refused.append(f"{plugin} is left out: {exc}")
            continue
        if backend.name in found:
            refused.append(f"{plugin} is left out: the name {backend.name!r} is a backend's already")
            continue
        found[backend.name] = backend
    if DEFAULT not in found:
        raise TokenvizError(f"no {DEFAULT} backend is registered (entry points {GROUP}): reinstall tokenviz")
    return found, refused


def registered_backends() -> dict[str, Backend]:
    """Every backend of the entry-point group, by its name (the built-in ones first, the default first of
    them). The table itself is returned: a test adds a backend of its own to it."""
    return _registry()[0]


def refusals() -> list[str]:
    """A line for each plugin left out (registered), to be said once."""
    return _registry()[1]


def _asks(backend: Backend, given: frozenset[str]) -> bool:
    try:
        return bool(backend.asked(given))
    except Exception as exc:  # a plugin's code
        why = safe_text(shortened(str(exc) or type(exc).__name__, 160))
        raise TokenvizError(f"the backend {backend.name!r} failed on its options: {why}") from None


def choose_backend(name: str | None, given: frozenset[str]) -> Backend:
    """The backend `--backend NAME` names; without it the one whose own options `given` ask for it, else
    the default. An option the backend chosen does not declare is one line naming the backends that do."""
    table = registered_backends()
    if name is not None:
        backend = table.get(name)
        if backend is None:
            raise TokenvizError(f"--backend {safe_text(name)!r}: the backends here are {', '.join(table)}")
    else:
        asking = [b for b in table.values() if (its := given & {o.name for o in b.options}) and _asks(b, its)]
        backend = asking[0] if asking else table[DEFAULT]
    own = {o.name for o in backend.options}
    for option in sorted(given - own):  # each a registered backend's option: the command line has no other
        flag = "--" + option.replace("_", "-")
        takers = [b.name for b in table.values() if option in {o.name for o in b.options}]
        whose = f"the {takers[0]} backend's option" if len(takers) == 1 else f"the {', '.join(takers)} backends' option"
        raise TokenvizError(f"{flag} is {whose}: it goes with --backend {' or '.join(takers)}")
    return backend
