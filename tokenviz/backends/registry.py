"""The backends registered (contract.backend: each a plugin, found through the entry-point group
`tokenviz.backends`), which one a command line chooses, and which backend runs a loaded model."""

from __future__ import annotations

import functools
import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, cast

from tokenviz.contract.backend import Backend
from tokenviz.contract.errors import TokenvizError

if TYPE_CHECKING:
    from tokenviz.backends.transformers.loading import LoadedModel
    from tokenviz.contract.engine import Engine

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


def engine_of(loaded: LoadedModel | Engine) -> Engine:
    """The engine that runs a loaded model: the transformers backend's runner for a model loaded in
    this process. An engine a loader made already (a served model's) is itself: what it lacks is only
    asked for behind the capabilities it declares (contract.engine.able, the keys' `needs`). (Deferred
    imports: this module is imported before the app's first frame, and the backend imports torch; a
    model loaded here has imported its loader already, so a served model never imports transformers'
    model code.)"""
    loading = sys.modules.get("tokenviz.backends.transformers.loading")
    if loading is not None and isinstance(loaded, loading.LoadedModel):
        from tokenviz.backends.transformers.runner import ModelRunner

        return ModelRunner(loaded)
    return cast("Engine", loaded)  # (not a LoadedModel: an engine)
