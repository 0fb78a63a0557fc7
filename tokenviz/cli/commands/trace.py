"""`tokenviz trace PROMPT`: the journey headless, a table or JSON."""

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from tokenviz.cli.backend_options import BackendChoice, journey_options
from tokenviz.cli.commands.common import (
    Outputs,
    Search,
    StepViews,
    check_chat,
    default_page_colors,
    new_cli,
    output_options,
    print_document,
    search_options,
    step_view_options,
)
from tokenviz.cli.intervention_options import InterventionChoice, intervention_options
from tokenviz.cli.options import Chat, LensLayersOption, System, err, fail, stderr_progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.lens_layers import parse_lens_layers
from tokenviz.contract.settings import SamplingSettings

trace_cli = new_cli()


@trace_cli.command()
@journey_options("trace", leave_out=("max_new_tokens",))
@intervention_options()
@output_options()
@search_options()
@step_view_options()
def trace(
    settings: SamplingSettings,
    backend: BackendChoice,
    interventions: InterventionChoice,
    outputs: Outputs,
    search: Search,
    views: StepViews,
    prompt: Annotated[str, typer.Argument(help="Text to start from.")],
    steps: Annotated[int, typer.Option(help="How many tokens to generate.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    lens_layers: LensLayersOption = None,
    chat: Chat = False,
    system: System = None,
) -> None:
    """Run the journey headless and print every step (a table, or JSON with --json). With
    interventions (--ablate, --steer, --steer-tokens, --patch) each step also gives the model's own
    distribution at the same context and the KL from it ("unsteered"). With --endpoint, the model a
    server runs (an OpenAI-compatible one, as vLLM's), a request per token; with --tokenizer DIR and
    the vllm-lens plugin on the server, its lens and attention rows too."""
    try:  # every option checked before torch is imported: a mistake is told in a moment
        chosen_rows = None if lens_layers is None else parse_lens_layers(lens_layers)
        lens = views.lens or chosen_rows is not None
        per_step = lens or views.routing or bool(views.sae)
        check_trace(steps, outputs, search, per_step, views.attribution, list(views.watch))
        if search.named:
            refuse_grammar(settings.grammar, "beam search" if search.beams else "speculative decoding")
        check_chat(chat, system)
        loader = backend.loader(settings, interventions.interventions)
        draft = None if search.draft_model is None else backend.with_values(model=search.draft_model).loader(settings)
    except TokenvizError as exc:
        fail(str(exc))
    from tokenviz.cli.headless import SaveFailed, TraceRequest, run_trace

    asked = TraceRequest(
        prompt,
        settings.replace(max_new_tokens=steps),
        chat=chat,
        system=system,
        views=dataclasses.replace(views, lens=lens),
        lens_layers=chosen_rows,
        interventions=interventions.interventions,
        beams=search.beams,
        speculate=search.speculate,
        save=outputs.save,
        html=(outputs.html, default_page_colors()) if outputs.html else None,
        force=outputs.force,
    )
    written: list[tuple[str, Path]] = []
    try:
        with stderr_progress() as progress:
            document = run_trace(asked, loader, draft, progress, written)
    except SaveFailed as exc:
        print_document(exc.document, as_json)  # the run's output is not lost with the file
        fail(str(exc))
    except TokenvizError as exc:
        fail(str(exc))
    for what, where in written:  # on stderr: stdout is the document's
        err.print(f"wrote {where} ({what})", highlight=False, markup=False, soft_wrap=True)
    print_document(document, as_json)


def check_trace(
    steps: int,
    outputs: Outputs,
    search: Search,
    per_step: bool,
    attribution: str | None,
    watch: list[str] | None,
) -> None:
    """Refuse trace's options that cannot work together, in one line, before anything is loaded."""
    if steps < 1:
        raise TokenvizError(f"--steps must be at least 1, got {steps}")
    if search.named and (outputs.save or outputs.html or per_step or attribution or watch):
        raise TokenvizError(
            "--beams and --speculate cannot be combined with --save, --html, --lens, --routing, --sae, --attribution "
            "or --watch"
        )
