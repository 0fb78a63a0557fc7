"""`tokenviz replay FILE`: a saved journey, and its check against the model (--verify)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import Theme, new_cli
from tokenviz.cli.options import (
    err,
    fail,
    stderr_progress,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

if TYPE_CHECKING:
    from tokenviz.contract.records import ModelInfo
    from tokenviz.files.journey_schema import Journey

replay_cli = new_cli()


@replay_cli.command()
@backend_options("replay")
def replay(
    backend: BackendChoice,
    path: Annotated[str, typer.Argument(help="A journey saved with x in the app or trace --save.")],
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-run it with the model; exit 0 only if every token matches.")
    ] = False,
    theme: Theme = DEFAULT_THEME,
) -> None:
    """Open a saved journey read-only, without loading any model (or --verify it against the model,
    or against the server with --endpoint for a journey on a served model: with --tokenizer DIR where it
    was steered)."""
    from tokenviz.files.journey_file import open_journey, read_journey, recording_of

    try:
        journey = open_journey(path)
        local = backend.backend().local
        if verify and (not local or journey.replay.info.requests):
            verify_served_recording(journey, read_journey(path), backend)
            return
        if verify:
            verify_recording(journey, backend)
            return
        if backend.given:
            flags = backend.flags()
            said = f"{', '.join(flags)} go{'es' * (len(flags) == 1)} with --verify"
            raise TokenvizError(f"{said}: a replay without it loads no model")
        recording = recording_of(journey)
        check_theme(theme)
    except TokenvizError as exc:
        fail(str(exc))
    in_terminal.require_terminal("tokenviz replay FILE --verify (or read FILE: it is JSON)")
    from tokenviz.worker.recording import RecordingWorker

    in_terminal.run_app(RecordingWorker(*recording), theme)


def verify_served_recording(journey: "Journey", recorded: dict[str, Any], backend: BackendChoice) -> None:
    """Re-run a journey recorded on a served model against `served` (the server), then check that the
    file is the journey the server gives now: its tokens and each chosen token's log-probability as it
    runs, then the whole file (`recorded`, its JSON) against the same journey saved again from the re-run
    (files.journey_diff: every id and text, every number within its tolerance, the model and server it
    names, the settings). --tokenizer: the model's directory gives the head a steered journey, or one
    with the lens, needs."""
    from tokenviz.backends.served.completions import REPRODUCED_WITHIN
    from tokenviz.cli.headless import remade_journey
    from tokenviz.files.journey_diff import first_difference
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.journey.session import Session

    info = journey.replay.info
    if backend.backend().local:
        raise TokenvizError(
            f"the journey was recorded on {info.name}, {info.device}: verify it against the server "
            "with --endpoint URL (and --api-key-env VAR or --api-key-file FILE)"
        )
    if not info.requests:
        raise TokenvizError("the journey was recorded on a model run here: verify it without --endpoint")
    session = Session(backend.loader(SamplingSettings())(lambda message, fraction: None))
    checked, mismatch = verify_journey(journey, session, REPRODUCED_WITHIN)
    differs = f"its token, or its log-probability by more than {REPRODUCED_WITHIN:g} nats"
    if mismatch is None:
        # As the journey ends: under the settings its last record (the pending step's, or the last step's where
        # it stopped) was decided under, never the file's own word for them: copied in, settings changed in
        # the file alone were "verified".
        session.set_settings(journey.replay.records[-1].decision.settings)
        found = first_difference(recorded, remade_journey(recorded, session))
        if found is not None:
            err.print(f"mismatch: {found}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1)
    others = sum(not b.current for b in journey.replay.branches)
    left = (
        f" (not its {others} other branch{'es' if others > 1 else ''}: a file keeps their summaries, not their steps)"
    )
    reproduced = "journey: every token, text, number and analysis" + (left if others else "")
    verdict(checked, mismatch, len(journey.steps), differs, reproduced)


def verdict(checked: int, mismatch: int | None, steps: int, differs: str, reproduced: str, other: str = "") -> None:
    """A verification's one line: the step that differs (exit 1), or all reproduced."""
    if mismatch is not None:
        err.print(
            f"mismatch: step {mismatch} differs from the recording ({differs}; {checked} of {steps} steps checked)"
            + other,
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    typer.echo(f"verified: all {checked} steps reproduce the recorded {reproduced}")


def how_it_ran(info: "ModelInfo") -> str:
    """What a model's numbers were computed with, as its description says: its runtime, dtype and
    attention ("llama.cpp, Q4_1, llama.cpp's own, flash attention off")."""
    return safe_text(f"{info.runtime.split(' ', 1)[0] or 'unknown'}, {info.dtype}, {info.attention}")


def verify_recording(journey: "Journey", backend: BackendChoice) -> None:
    """Re-run a recording with the model; exit 1 at the first token that differs. Without --model, the
    model the journey names (the bundled one, a path, a hub id); with it, a line where they differ."""
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.journey.session import Session
    from tokenviz.system.paths import BUNDLED_NAME

    recorded = journey.replay.info.name
    if backend.model is None and recorded != BUNDLED_NAME:
        if recorded.endswith(".gguf") and not Path(recorded).expanduser().is_file():
            raise TokenvizError(f"the journey was recorded on {recorded}, which is not here: name it with --model")
        backend = backend.with_values(model=recorded)
        err.print(f"verifying on {recorded}, the model the journey was recorded on", markup=False, highlight=False)
    with stderr_progress() as progress:
        engine = backend.loader(SamplingSettings())(progress)
    differs = engine.info.name != recorded
    if differs:
        err.print(
            f"note: the journey was recorded on {recorded}; verifying on {engine.info.name}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    then, now = how_it_ran(journey.replay.info), how_it_ran(engine.info)
    if then != now:  # (another runtime, dtype or attention: the same model's numbers differ)
        err.print(f"note: the journey ran as {then}; verifying as {now}", markup=False, highlight=False, soft_wrap=True)
    checked, mismatch = verify_journey(journey, Session(engine))
    other = f" (recorded on another model: {recorded})" if differs else ""
    other += f" (it ran as {then}, not {now})" if then != now and not other else ""
    verdict(checked, mismatch, len(journey.steps), "its token, or the experts it was routed to", "tokens", other)
