"""A journey as one self-contained HTML page: data, script and styles inline, no network needed.

Click a token (or use ← →) to see the step made after it, as the app's cursor shows it (the newest
token: the pending step): the model's top candidates with raw and
final probabilities, every sampling stage, the draw; the attention of any layer and head as a
heatmap with token labels; charts of the journey over its steps. Text from the model reaches the
page only as JSON inside a script element (with `<` escaped) and is inserted with textContent.
"""

from __future__ import annotations

import base64
import json
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from tokenviz.contract.attention import SavedAttention
from tokenviz.contract.commands import PageView
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import Inspection, lens_row_label
from tokenviz.contract.snapshot import Snapshot
from tokenviz.files.atomic import write_file
from tokenviz.files.record_json import as_json, settings_json
from tokenviz.files.svg_charts import line_chart

HERE = Path(__file__).parent
CSS = (HERE / "journey_page.css").read_text(encoding="utf-8")  # the page's styles and script, kept
SCRIPT = (HERE / "journey_page.js").read_text(encoding="utf-8")  # beside this module as plain files
ATTENTION_BYTES = 1_200_000  # compressed attention a page carries at most: the newest rows first
TOP_ROWS = 12  # candidates listed per step (the raw top-12 are followed through every stage)
DEFAULT_HEATMAP = ("#0d0887", "#6a00a8", "#b12a90", "#e16462", "#fca636", "#f0f921")  # plasma


HEX_COLOR = re.compile(r"#[0-9a-fA-F]{6}")  # a heatmap stop the page can interpolate


def _attention(snapshot: Snapshot, attention: SavedAttention) -> dict[str, Any] | None:
    """The saved rows as √weight in uint8, deflated: newest first, as many as ATTENTION_BYTES allows."""
    if snapshot.info is None or not attention.rows:
        return None
    positions = sorted(attention.rows)
    while positions:
        parts = [
            np.rint(np.sqrt(np.clip(attention.rows[p][:, :, : p + 1].astype(np.float32), 0, 1)) * 255).astype(np.uint8)
            for p in positions
        ]
        packed = zlib.compress(b"".join(part.tobytes() for part in parts), 9)
        if len(packed) <= ATTENTION_BYTES:
            return {
                "positions": positions,
                "layers": snapshot.info.layers,
                "heads": snapshot.info.heads,
                "data": base64.b64encode(packed).decode(),
            }
        positions = positions[len(positions) // 4 or 1 :]  # drop the oldest quarter
    return None


def _steps(snapshot: Snapshot) -> list[dict[str, Any]]:
    out = []
    for r in snapshot.records:
        d = r.decision
        final = d.final_by_id
        out.append(
            {
                "index": r.index,
                "position": r.position,
                "entropy": r.entropy,
                "top": [[c.id, c.text, c.prob, final.get(c.id)] for c in r.top[:TOP_ROWS]],
                "chosen": [d.chosen_id, d.chosen_text],
                "mode": d.mode,
                "u": d.u,
                "band": list(d.band) if d.band else None,
                "chosen_prob": d.final_prob,  # (1 under greedy: the app shows its final one-hot)
                "chosen_rank": d.chosen_rank,
                "raw_prob": d.raw_prob,
                "raw_rank": d.raw_rank,
                "stages": [[s.name, s.detail, s.kept, s.mass] for s in d.stages],
                "settings": settings_json(d.settings),
                "watch": [[p.id, p.text, p.prob, p.final_prob, p.rank] for p in d.pinned],
                # the interventions in force at this step, and the model's own distribution beside them
                "interventions": [i.label for i in r.interventions],
                "own": (
                    {
                        "top": [[c.id, c.text, c.prob] for c in r.unsteered.top[:TOP_ROWS]],
                        "kl": _finite(r.unsteered.kl),
                        "floor": r.unsteered.kl_floor,
                    }
                    if r.unsteered
                    else None
                ),
            }
        )
    return out


def _finite(x: float) -> float | None:
    """`x`, or None where it is not finite (JSON has no infinity; the page writes ∞)."""
    return x if math.isfinite(x) else None


def _charts(snapshot: Snapshot, colors: dict[str, str]) -> list[str]:
    records = snapshot.records
    steps = [float(r.index) for r in records]
    bar, final = colors["bar"], colors["bar_final"]
    info = snapshot.info
    served = info is not None and bool(info.requests)  # a step is a request; the server keeps its own cache
    top_n = f", a floor: {info.giver}'s top N" if info and info.covers else ""
    charts = [  # each on its own axis: bits, and a probability from 0 to 1
        line_chart(f"entropy by step (bits{top_n})", steps, [("entropy", [r.entropy for r in records], bar)], "step"),
        line_chart(
            "p(chosen) by step: the token's final p",
            steps,
            [("p chosen", [r.decision.final_prob for r in records], final)],
            "step",
            y_range=(0.0, 1.0),
        ),
    ]
    palette = [bar, final, colors["chosen"], colors["primary"]]
    watched = [
        (text, [next((p.prob for p in r.decision.pinned if p.id == token), 0.0) for r in records], palette[i % 4])
        for i, (token, text) in enumerate(snapshot.pinned)
    ]
    if watched:
        charts.append(line_chart("watched tokens: raw p by step", steps, watched, "step"))
    predictions = records[0].prompt_predictions if records else ()
    if predictions:
        charts.append(
            line_chart(
                "the prompt's surprisal (bits)",
                [float(p.position + 1) for p in predictions],
                [("surprisal", [p.surprisal for p in predictions], bar)],
                "prompt position",
            )
        )
    decoded = records[1:]
    if decoded:  # a served model's: a request's time, not a forward pass's
        took, over = ("request", "tokens of context") if served else ("decode", "tokens in the KV cache")
        charts.append(
            line_chart(
                f"{took} ms against context",
                [float(r.kv_len) for r in decoded],
                [("request ms" if served else "forward ms", [r.forward_ms for r in decoded], bar)],
                over,
            )
        )
    if decoded and not served:  # the server's KV cache is its own
        charts.append(
            line_chart(
                "KV cache MB against tokens",
                [float(r.kv_len) for r in records],
                [("KV MB", [r.kv_bytes / 2**20 for r in records], final)],
                "tokens in the KV cache",
            )
        )
    return [c for c in charts if c]


def _lens(inspections: Sequence[Inspection]) -> dict[str, list[list[Any]]]:
    """The logit lens kept at each position: (row, top-1 id, its text, its p, the chosen token's rank, its p,
    the row's label as the app shows it)."""
    out = {}
    for inspection in inspections:
        rows = []
        for row in inspection.lens:
            top_id, top_text, top_p = row.top[0] if row.top else (-1, "", math.nan)
            rows.append(
                [
                    row.layer,
                    top_id,
                    top_text,
                    _finite(top_p),
                    row.chosen_rank,
                    _finite(row.chosen_prob),
                    lens_row_label(row.layer),
                ]
            )
        out[str(inspection.position)] = rows
    return out


def journey_page(
    snapshot: Snapshot,
    attention: SavedAttention,
    colors: dict[str, Any],
    view: PageView = PageView(),
    lens: Sequence[Inspection] = (),
    features: Mapping[str, Any] | None = None,
) -> str:
    """The page, opening at `view` (the app's layer, head and cursor), with the logit `lens` the journey
    kept (its positions on the current path) and the SAE `features` a trace read (page_features).
    `colors`: background, foreground, panel, primary, bar, bar_final, chip_prompt, chip_generated, chosen
    (CSS colours) and heatmap (a list of stops, low to high)."""
    heatmap = [c for c in colors["heatmap"] if HEX_COLOR.fullmatch(c)]
    if len(heatmap) < 2:  # a scale needs both ends: the default, rather than a blank heatmap
        heatmap = list(DEFAULT_HEATMAP)
    colors = {key: _css_color(value) for key, value in colors.items() if key != "heatmap"}
    info = snapshot.info
    data = {
        "model": as_json(info) if info else {},
        "settings": settings_json(snapshot.settings),
        "chips": [[c.id, c.text, c.is_prompt, c.is_special] for c in snapshot.chips],
        "prompt_len": snapshot.prompt_len,
        "steps": _steps(snapshot),
        "predictions": [
            [p.position, [[c.id, c.text, c.prob] for c in p.top[:TOP_ROWS]], p.next_id, p.next_prob, p.next_rank]
            for p in (snapshot.records[0].prompt_predictions if snapshot.records else ())
        ],
        "attention": _attention(snapshot, attention),
        "lens": _lens(lens),
        "features": dict(features or {}),
        "heatmap": heatmap,
        "view": {"layer": view.layer, "head": view.head, "cursor": view.cursor},
    }
    payload = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    css = CSS
    for key in (
        "background",
        "foreground",
        "panel",
        "primary",
        "bar",
        "bar_final",
        "chip_prompt",
        "chip_generated",
        "chosen",
    ):
        css = css.replace(f"var(--{key.replace('_', '-')})", colors[key])
    title = escape(f"tokenviz · {info.name if info else 'journey'}")  # the model's name, once: not in the facts
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{title}</title><style>{css}</style></head>'
        f'<body><header><h1>{title}</h1><div id="facts"></div></header>'
        '<section id="tokens" aria-label="tokens"></section><div id="text"></div>'
        '<main><section id="step" aria-live="polite"></section>'
        '<section id="attention"><div class="controls"><label>layer <select id="layer"></select></label> '
        '<label>head <select id="head"></select></label> <span id="hover"></span></div>'
        '<div id="scale" class="dim"><span>0</span><span id="ramp"></span><span>1 (colour by √weight)</span></div>'
        '<div id="map"><canvas id="heatmap" width="10" height="10"></canvas></div>'
        '<p id="attention-note" class="dim"></p></section></main>'
        f'<section id="charts">{"".join(_charts(snapshot, colors))}</section>'
        f'<footer class="dim">Made by tokenviz: {escape(_provenance(info))} '
        "← → move between steps.</footer>"
        f'<script type="application/json" id="data">{payload}</script><script>{SCRIPT}</script></body></html>\n'
    )


def _provenance(info: ModelInfo | None) -> str:
    """Where the page's numbers come from, as the footer says it."""
    if info is not None and info.covers:
        return (
            f"every number is one {info.giver} returned (its top {info.covers} log-probabilities a step) or one "
            "computed here from them; the rest of the vocabulary is unknown."
        )
    return "every number is the one the model computed."


def _css_color(value: str) -> str:
    """A colour from a theme, kept only if it is a plain hex colour or a name (nothing else reaches the CSS)."""
    v = value.strip()
    if (
        v.startswith("#") and all(ch in "0123456789abcdefABCDEF" for ch in v[1:]) and len(v) in (4, 7, 9)
    ) or v.isalpha():
        return v
    return "inherit"


def save_page(
    path: str | Path,
    snapshot: Snapshot,
    attention: SavedAttention,
    colors: Iterable[tuple[str, Any]],
    view: PageView = PageView(),
    replace: bool = False,
    lens: Sequence[Inspection] = (),
    features: Mapping[str, Any] | None = None,
) -> Path:
    """Write the page atomically, opening at `view`, with the `lens` and SAE `features` kept; an existing
    file is replaced only with `replace`."""
    page = journey_page(snapshot, attention, dict(colors), view, lens, features)
    return write_file(path, page, replace=replace)


def page_features(document: Mapping[str, Any]) -> dict[str, Any]:
    """What a trace document's SAE readings give the page: each step's readings by the position that made
    it (`at`), and the labels of the features on at some step (`labels`, by "SAE#ID")."""
    at = {str(step["position"]): step["sae"] for step in document.get("steps", ()) if "sae" in step}
    labels = {f"{label['sae']}#{label['id']}": label for label in document.get("sae_labels", ())}
    return {"at": at, "labels": labels} if at else {}
