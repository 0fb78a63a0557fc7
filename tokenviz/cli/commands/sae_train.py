"""`tokenviz sae-train --text FILE --layer L --out DIR`: a small TopK sparse autoencoder trained on the
model's residual after a layer over a text of the user's, written in SAELens' layout for --sae."""

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands.common import new_cli
from tokenviz.cli.options import err, fail, stderr_progress
from tokenviz.contract.backend import Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.system.reading import read_file

TEXT_BYTES = 64 * 2**20  # the most of a text file read

sae_train_cli = new_cli()


def read_text(path: str) -> str:
    """The text file a model reads for an SAE (UTF-8, at most TEXT_BYTES): else one line."""
    try:
        return read_file(path, TEXT_BYTES, f"the text {safe_text(path)}").decode("utf-8")
    except UnicodeDecodeError:
        raise TokenvizError(f"the text {safe_text(path)} is not UTF-8") from None


def told(progress: Progress, what: str) -> Callable[[int, int], None]:
    """A (done, total) callback saying `what: done of total` through `progress`."""
    return lambda done, total: progress(f"{what}: {done} of {total}", done / total)


@sae_train_cli.command()
@backend_options("sae-train")
def sae_train(
    backend: BackendChoice,
    text: Annotated[str, typer.Option("--text", help="A text file to train on (UTF-8; its tokens' residuals).")],
    layer: Annotated[int, typer.Option("--layer", help="The decoder layer (from 0) whose output it reads.")],
    out: Annotated[str, typer.Option("--out", help="The folder to write it to (made; SAELens' layout).")],
    features: Annotated[int, typer.Option("--features", help="How many features it has.")] = 2048,
    k: Annotated[int, typer.Option("--k", help="How many are active at a position (TopK).")] = 32,
    steps: Annotated[int, typer.Option("--steps", help="Batches of 256 residuals (0: four passes over them).")] = 0,
    window: Annotated[int, typer.Option("--window", help="Tokens fed at once (at most the model's context).")] = 256,
    seed: Annotated[int, typer.Option("--seed", help="The initial weights' and batches' seed.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Write into a folder that holds an SAE already.")] = False,
) -> None:
    """Train a small TopK SAE on the residual after --layer over --text, and write it to --out in SAELens'
    layout (cfg.json, sae_weights.safetensors) for `tokenviz trace PROMPT --sae OUT` and SAELens. It
    prints the fraction of the residuals' variance left unexplained before and after."""
    folder = Path(out).expanduser()
    try:
        for value, name, least in ((features, "--features", 1), (k, "--k", 1), (window, "--window", 2)):
            if value < least:
                raise TokenvizError(f"{name} must be at least {least}, got {value}")
        if k > features:
            raise TokenvizError(f"--k {k} is more than --features {features}")
        if steps < 0:
            raise TokenvizError(f"--steps must be 0 or more, got {steps}")
        if (folder / "cfg.json").exists() and not force:
            raise TokenvizError(f"{safe_text(str(folder))} holds an SAE already: --force writes over it")
        if folder.exists() and not folder.is_dir():
            raise TokenvizError(f"{safe_text(str(folder))} is not a folder")
        words = read_text(text)
        loader = backend.loader(SamplingSettings())
    except TokenvizError as exc:
        fail(str(exc))
    from tokenviz.features.training import collect_residuals, steps_for, train, write_saelens

    try:
        with stderr_progress() as progress:
            engine = loader(progress)
            info = engine.info
            if not 0 <= layer < info.layers:
                raise TokenvizError(f"--layer {layer}: {info.name}'s layers are 0-{info.layers - 1}")
            ids = engine.encode(words)
            residuals = collect_residuals(engine, ids, layer, min(window, info.context), told(progress, "reading"))
            total = steps or steps_for(len(residuals))
            trained = train(residuals, layer, features, k, total, seed, told(progress, "training"), folder.name)
        extra = {"trained_by": "tokenviz sae-train", "text": safe_text(Path(text).name), "tokens": len(ids)}
        write_saelens(trained.sae, folder, info.name, extra)
    except TokenvizError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {safe_text(str(folder))}: {exc.strerror or exc}")
    err.print(
        f"{trained.residuals:,} residuals after layer {layer} of {safe_text(info.name)}; {features:,} features, "
        f"k {k}, {total:,} steps: unexplained variance {trained.fvu_before:.3f} at the start, "
        f"{trained.fvu_after:.3f} now",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    typer.echo(f"wrote {folder} (an SAE in SAELens' layout: tokenviz trace PROMPT --sae {folder})")
