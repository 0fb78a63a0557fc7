"""The trace document as a table on the terminal (`tokenviz trace` without --json)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tokenviz.render.pieces import visible

RIGHT = ("step", "id", "p(final)", "rank", "u", "fwd ms")


def print_table(doc: dict[str, Any], console: Console) -> None:
    m = doc["model"]
    console.print(f"[bold]{m['name']}[/] · {m['device']} · {m['dtype']} · {m['layers']} layers · {m['heads']} heads")
    console.print("prompt: " + " ".join(f"[cyan]{visible(t['text'])}[/][dim]{t['id']}[/]" for t in doc["prompt"]))
    table = Table(show_lines=False, header_style="bold")
    for col in (
        "step",
        "chosen",
        "id",
        "p(final)",
        "rank",
        "mode",
        "u",
        "top 3 (raw softmax)",
        "stages kept",
        "fwd ms",
    ):
        table.add_column(col, justify="right" if col in RIGHT else "left")
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
