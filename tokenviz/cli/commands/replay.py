"""`tokenviz replay FILE`: a saved journey, and its check against the model (--verify)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenviz.cli.backend_options import BackendChoice, backend_options
from tokenviz.cli.commands import in_terminal
from tokenviz.cli.commands.common import Theme, new_cli, print_document
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
    from tokenviz.journey.session import Session

replay_cli = new_cli()


@replay_cli.command()
@backend_options("replay")
def replay(
    backend: BackendChoice,
    path: Annotated[str, typer.Argument(help="A journey saved with x in the app or trace --save.")],
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-run it with the model; exit 0 only if every token matches.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print it as trace --json does (its steps made from its records); no app."),
    ] = False,
    theme: Theme = DEFAULT_THEME,
) -> None:
    """Open a saved journey read-only, without loading any model (or --verify it against the model,
    or against the server with --endpoint for a journey on a served model: with --tokenizer DIR where it
    was steered)."""
    from tokenviz.files.journey_file import load_journey, recording_of, trace_document_of

    try:
        doc, journey = load_journey(path)  # read and validated once, whatever is asked of it
        if as_json and verify:
            raise TokenvizError("choose --json or --verify, not both")
        if as_json:
            print_document(trace_document_of(doc, journey), as_json=True)
            return
        if verify:
            verify_recording(journey, doc, backend)
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


def verify_recording(journey: "Journey", recorded: dict[str, Any], backend: BackendChoice) -> None:
    """Re-run a recording on the model the options open; exit 1 at the first step that differs. Without
    options, the model the journey names (the bundled one, a path, a hub id), or for one whose steps were
    requests, a line saying how it was opened. An engine whose recordings are all its numbers
    (ModelInfo.reproduced_within: a server's) checks each chosen token's log-probability within that, then
    the whole file (`recorded`, its JSON) against the journey saved again (verify_whole)."""
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.journey.session import Session
    from tokenviz.system.paths import BUNDLED_NAME
    from tokenviz.ui.panes.base import live_command

    info = journey.replay.info
    name = info.name
    if info.requests and not backend.given:
        raise TokenvizError(
            f"the journey on {name} was requests to {info.requests}: verify it with the options "
            f"it was opened with ({info.reopen or 'its server'}) after replay FILE --verify"
        )
    here = backend.backend().weights_here  # a model whose weights load here is named by --model
    if not info.requests and here and backend.model is None and name != BUNDLED_NAME:
        if name.endswith(".gguf") and not Path(name).expanduser().is_file():
            raise TokenvizError(f"the journey was recorded on {name}, which is not here: name it with --model")
        backend = backend.with_values(model=name)
        err.print(f"verifying on {name}, the model the journey was recorded on", markup=False, highlight=False)
    with stderr_progress() as progress:
        engine = backend.loader(SamplingSettings())(progress)
    now = engine.info
    if bool(info.requests) != bool(now.requests):  # a request's numbers and a pass's are not the same journey
        was, runs = (f"requests to {i.requests}" if i.requests else "passes in this process" for i in (info, now))
        raise TokenvizError(
            f"the journey's steps were {was}, not {runs}: verify it with "
            f"the options it was opened with ({live_command(info)})"
        )
    if now.reproduced_within is not None:
        verify_whole(journey, recorded, Session(engine), now.reproduced_within)
        return
    differs = now.name != name
    if differs:
        err.print(
            f"note: the journey was recorded on {name}; verifying on {now.name}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    then, as_now = how_it_ran(info), how_it_ran(now)
    if then != as_now:  # another runtime, dtype or attention: the same model's numbers differ
        err.print(
            f"note: the journey ran as {then}; verifying as {as_now}", markup=False, highlight=False, soft_wrap=True
        )
    checked, mismatch = verify_journey(journey, Session(engine))
    other = f" (recorded on another model: {name})" if differs else ""
    other += f" (it ran as {then}, not {as_now})" if then != as_now and not other else ""
    verdict(checked, mismatch, journey.generated, "its token, or the experts it was routed to", "tokens", other)


def verify_whole(journey: "Journey", recorded: dict[str, Any], session: "Session", within: float) -> None:
    """Re-run a journey whose file is all its model's numbers, each chosen token's log-probability
    within `within` nats as it runs, then check the whole file (`recorded`, its JSON) against the same
    journey saved again from the re-run (files.journey_diff: every id and text, every number within its
    tolerance, the model and server it names, the settings)."""
    from tokenviz.cli.headless import remade_journey
    from tokenviz.files.journey_diff import first_difference
    from tokenviz.journey.reproduce import verify_journey

    checked, mismatch = verify_journey(journey, session, within)
    differs = f"its token, or its log-probability by more than {within:g} nats"
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
    verdict(checked, mismatch, journey.generated, differs, reproduced)


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
