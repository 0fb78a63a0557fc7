"""The headless journey: load, prefill, step until done, as one JSON-ready document."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.table import Table

from tokenviz.engine import ModelRunner, load_model
from tokenviz.render.pieces import visible
from tokenviz.settings import SamplingSettings
from tokenviz.session import Session


def document_of_snapshot(snapshot) -> dict:
    """The trace document: model, prompt, every committed step, the text."""
    committed = len(snapshot.chips) - snapshot.prompt_len
    return {
        "model": snapshot.info.to_json(),
        "settings": snapshot.settings.to_json(),
        "prompt": [{"id": c.id, "text": c.text} for c in snapshot.chips[: snapshot.prompt_len]],
        "steps": [r.to_json() for r in snapshot.records[:committed]],
        "prefill_ms": snapshot.records[0].forward_ms if snapshot.records else None,
        "stop_reason": snapshot.stop_reason,
        "text": snapshot.text,
        "full_text": snapshot.full_text,
    }


def journey_document(session: Session) -> dict:
    from tokenviz.bridge import snapshot_of

    return document_of_snapshot(snapshot_of(session))


def add_lens(session: Session, document: dict) -> None:
    """Each step gains its logit lens: one entry per layer (0 = the embeddings), the last being
    the model's own output. One forward pass serves every step."""
    from tokenviz.engine.internals import inspect_positions

    n = len(session.prompt_ids)
    steps = document["steps"]
    positions = [n - 1 + i for i in range(len(steps))]
    if not positions:
        return
    chosen = [step["chosen"]["id"] for step in steps]
    inspections = inspect_positions(session.runner, session.ids[: positions[-1] + 1], positions, chosen)
    for step, inspection in zip(steps, inspections):
        step["lens"] = [row.to_json() for row in inspection.lens]
        step["lens_first_top1_layer"] = inspection.first_top1_layer


def output_document(session: Session, prompt_ids: list[int], generated: list[int], **extra) -> dict:
    """The trace document of a run that produced `generated` without stepping the journey."""
    runner = session.runner
    return {
        "model": runner.info.to_json(),
        "settings": session.settings.to_json(),
        "prompt": [{"id": t, "text": runner.piece(t)} for t in prompt_ids],
        "steps": [{"index": i, "chosen": {"id": t, "text": runner.piece(t)}} for i, t in enumerate(generated)],
        **extra,
        "text": runner.decode(generated),
        "full_text": runner.decode(prompt_ids + generated),
    }


def beam_document(session: Session, prompt: str, width: int, steps: int) -> dict:
    """The trace document of a beam search: "beams" holds every step; "text" is the best beam."""
    from tokenviz.beams import beam_search

    _, ids = session.encode_prompt(prompt)  # the beams run on their own cache: no prefill here
    result = beam_search(session.runner, ids, width, steps)
    return output_document(session, ids, list(result.final[0].ids), beams=result.to_json())


def speculation_document(session: Session, prompt: str, spec: str, draft) -> dict:
    """The trace document of speculative decoding: the steps are the output tokens."""
    from tokenviz.speculate import make_drafter, speculative_decode

    drafter = make_drafter(spec, session.runner, draft)
    _, ids = session.encode_prompt(prompt)
    result = speculative_decode(session.runner, ids, drafter, session.settings.max_new_tokens, session.settings)
    return output_document(session, ids, list(result.ids), speculation=result.to_json())


def run_session(session: Session, prompt: str) -> Session:
    """Prefill and step until a stop condition (max new tokens bounds it)."""
    session.start(prompt)
    while session.step() is not None:
        pass
    return session


def run_trace(
    prompt: str,
    settings: SamplingSettings,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    progress: Callable[[str, float | None], None] = lambda message, fraction: None,
    lens: bool = False,
    save: str | None = None,
    beams: int | None = None,
    speculate: str | None = None,
    draft_model: str | None = None,
) -> dict:
    loaded = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, progress=progress)
    session = Session(ModelRunner(loaded), settings)
    if beams:
        return beam_document(session, prompt, beams, settings.max_new_tokens)
    if speculate:
        draft = None
        if draft_model:
            draft = ModelRunner(load_model(draft_model, device=device, dtype=dtype,
                                           trust_remote_code=trust_remote_code, progress=progress))
        return speculation_document(session, prompt, speculate, draft)
    document = journey_document(run_session(session, prompt))
    if lens:
        add_lens(session, document)
    if save:
        from tokenviz.bridge import snapshot_of
        from tokenviz.journey import save_journey

        save_journey(save, snapshot_of(session), document)
    return document


def print_table(doc: dict, console: Console) -> None:
    m = doc["model"]
    console.print(f"[bold]{m['name']}[/] · {m['device']} · {m['dtype']} · {m['layers']} layers · {m['heads']} heads")
    console.print("prompt: " + " ".join(f"[cyan]{visible(t['text'])}[/][dim]{t['id']}[/]" for t in doc["prompt"]))
    table = Table(show_lines=False, header_style="bold")
    for col in ("step", "chosen", "id", "p(final)", "rank", "mode", "u", "top 3 (raw softmax)", "stages kept", "fwd ms"):
        table.add_column(col, justify="right" if col in ("step", "id", "p(final)", "rank", "u", "fwd ms") else "left")
    for s in doc["steps"]:
        draw = s["draw"]
        table.add_row(
            str(s["index"]),
            visible(s["chosen"]["text"]),
            str(s["chosen"]["id"]),
            f"{s['chosen']['prob']:.3f}",
            str(draw["raw_rank"]),
            draw["mode"],
            "" if draw["u"] is None else f"{draw['u']:.3f}",
            "  ".join(f"{visible(t['text'])} {t['prob']:.2f}" for t in s["top"][:3]),
            " → ".join(f"{st['name']} {st['kept']}" for st in s["stages"]) or "—",
            f"{s['ms']['forward']:.1f}",
        )
    console.print(table)
    console.print(f"[bold]text:[/] {doc['full_text']}")
    if doc["stop_reason"]:
        console.print(f"[dim]stopped: {doc['stop_reason']}[/]")
