"""The backends registered (contract.backend: each a plugin, found through the entry-point group
`tokenviz.backends`), which one a command line chooses."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

from tokenviz.contract.backend import Backend
from tokenviz.contract.errors import TokenvizError

GROUP = "tokenviz.backends"
DEFAULT = "transformers"


@functools.cache
def registered() -> dict[str, Backend]:
    """Every backend of the entry-point group, by its name (the default first). The table itself is
    returned: a test adds a backend of its own to it."""
    found: dict[str, Backend] = {}
    for point in sorted(entry_points(group=GROUP), key=lambda p: (p.name != DEFAULT, p.name)):
        backend = point.load()
        found[backend.name] = backend
    if DEFAULT not in found:
        raise TokenvizError(f"no {DEFAULT} backend is registered (entry points {GROUP}): reinstall tokenviz")
    return found


def chosen(name: str | None, given: frozenset[str]) -> Backend:
    """The backend `--backend NAME` names; without it the one whose own options `given` ask for it, else
    the default. An option of another backend is one line naming the backend it goes with."""
    table = registered()
    if name is not None:
        backend = table.get(name)
        if backend is None:
            raise TokenvizError(f"--backend {name!r}: the backends here are {', '.join(table)}")
    else:
        asking = [b for b in table.values() if b.asked(given & {o.name for o in b.options})]
        backend = asking[0] if asking else table[DEFAULT]
    own = {o.name for o in backend.options}
    for other in table.values():
        stray = [o.flag for o in other.options if o.name in given and o.name not in own]
        if other is not backend and stray:
            raise TokenvizError(f"{stray[0]} is the {other.name} backend's option: it goes with --backend {other.name}")
    return backend
