"""Which backend runs a loaded model: the one place an engine (contract.engine) is made."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from tokenviz.backends.transformers.loading import LoadedModel
    from tokenviz.contract.engine import Engine


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
