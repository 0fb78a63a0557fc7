"""Which backend runs a loaded model: the one place an engine (contract.engine) is made."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from tokenviz.backends.transformers.loading import LoadedModel
    from tokenviz.contract.engine import Engine, InternalsEngine


def engine_of(loaded: LoadedModel | Engine) -> InternalsEngine:
    """The engine that runs a loaded model: the transformers backend's runner for a model loaded in
    this process. An engine a loader made already (a served model's) is itself: typed as the highest
    tier, since the journey holds any engine, but what a lower tier lacks is only asked for behind the
    capabilities it declares (journey.views, the keys' `needs`). (Deferred imports: this module is
    imported before the app's first frame, and the backend imports torch; a model loaded here has
    imported its loader already, so a served model never imports transformers' model code.)"""
    loading = sys.modules.get("tokenviz.backends.transformers.loading")
    if loading is not None and isinstance(loaded, loading.LoadedModel):
        from tokenviz.backends.transformers.runner import ModelRunner

        return ModelRunner(loaded)
    return cast("InternalsEngine", loaded)
