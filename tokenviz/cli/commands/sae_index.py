"""`tokenviz sae-index DIR --text FILE`: each feature's top-activating contexts over a text of the user's,
written beside each SAE in DIR (features.feature_notes), for the features view and the trace's labels."""

from pathlib import Path
from typing import Annotated

import typer

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands.common import new_cli
from tokenviz.cli.commands.sae_train import read_text, told
from tokenviz.cli.options import fail, stderr_progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text

sae_index_cli = new_cli()


@sae_index_cli.command()
@backend_options("sae-index")
def sae_index(
    backend: BackendChoice,
    folder: Annotated[str, typer.Argument(help="The SAE's folder (SAELens, Gemma Scope 2 or sparsify).")],
    text: Annotated[str, typer.Option("--text", help="A text file to read (UTF-8): its tokens' residuals.")],
    window: Annotated[int, typer.Option("--window", help="Tokens fed at once (at most the model's context).")] = 256,
) -> None:
    """Read --text through the model, encode the residual after each SAE's layer at every position (each
    window's first left out: the attention sink), and write each feature's five strongest contexts to
    tokenviz-index.json beside the SAE: the features view and `trace --sae` show them with the feature."""
    try:
        if window < 2:
            raise TokenvizError(f"--window must be at least 2, got {window}")
        words = read_text(text)
        from tokenviz.cli.headless import saes_in

        saes = saes_in([folder])  # before the model: a bad one is told now
        loader = backend.loader(SamplingSettings())
    except TokenvizError as exc:
        fail(str(exc))
    from tokenviz.features.feature_notes import index_features, write_index
    from tokenviz.features.training import window_residuals, windows
    from tokenviz.journey.feature_readings import check_saes

    try:
        with stderr_progress() as progress:
            engine = loader(progress)
            check_saes(engine, saes)
            ids = engine.encode(words)
            if len(ids) < 2:
                raise TokenvizError("the text is too short to index: it needs two tokens or more")
            parts = windows(ids, min(window, engine.info.context))
            written = []
            for sae in saes:
                residuals = window_residuals(engine, parts, sae.layer, told(progress, f"reading {sae.name}"))
                features = index_features(sae, residuals, parts, engine.piece)
                written.append((write_index(sae, features, safe_text(Path(text).name), len(ids)), len(features)))
    except TokenvizError as exc:
        fail(str(exc))
    for path, count in written:
        typer.echo(f"wrote {path} ({count:,} features active over {len(ids):,} tokens)")
