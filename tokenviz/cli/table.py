"""The trace and score documents as tables on the terminal (`tokenviz trace` and `tokenviz score`
without --json).

Model output and the prompt are plain text here, never Rich markup: a piece such as "[/]" prints as
typed. A beam or speculation document lists its output tokens (its own JSON holds the details).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tokenviz.contract.text import safe_text
from tokenviz.render.pieces import visible

RIGHT = ("step", "id", "p(final)", "rank", "u", "fwd ms")


def print_table(doc: dict[str, Any], console: Console) -> None:
    m = doc["model"]
    header = f"{m['name']} · {m['device']} · {m['dtype']} · {m['layers']} layers · {m['heads']} heads"
    console.print(Text(safe_text(header), style="bold"))
    prompt = Text("prompt: ")
    for t in doc["prompt"]:
        prompt.append(visible(t["text"]), style="cyan").append(str(t["id"]), style="dim").append(" ")
    console.print(prompt)
    if doc["steps"] and "draw" in doc["steps"][0]:
        console.print(_steps(doc["steps"]))
    else:
        console.print(
            Text("output: " + " ".join(f"{visible(s['chosen']['text'])}{s['chosen']['id']}" for s in doc["steps"]))
        )
    console.print(Text.assemble(("text: ", "bold"), safe_text(doc["full_text"])))
    if doc.get("stop_reason"):
        console.print(Text(f"stopped: {safe_text(doc['stop_reason'])}", style="dim"))


def _steps(steps: list[dict[str, Any]]) -> Table:
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
        *(("led most by (attribution)",) if "attribution" in steps[0] else ()),
        *(("watch: p raw/final #rank",) if "watch" in steps[0] else ()),
    ):
        table.add_column(col, justify="right" if col in RIGHT else "left")
    for s in steps:
        draw = s["draw"]
        led = [Text(_strongest(s["attribution"]))] if "attribution" in s else []
        watched = [Text(_watched(s["watch"]))] if "watch" in s else []
        table.add_row(
            str(s["index"]),
            Text(visible(s["chosen"]["text"])),
            str(s["chosen"]["id"]),
            f"{s['chosen']['prob']:.3f}",
            str(draw["raw_rank"]),
            draw["mode"],
            "" if draw["u"] is None else f"{draw['u']:.3f}",
            Text("  ".join(f"{visible(t['text'])} {t['prob']:.2f}" for t in s["top"][:3])),
            Text(" → ".join(f"{st['name']} {st['kept']}" for st in s["stages"]) or "—"),
            f"{s['ms']['forward']:.1f}",
            *led,
            *watched,
        )
    return table


def _watched(watch: list[dict[str, Any]]) -> str:
    return "  ".join(f"{visible(w['text'])} {w['prob']:.3f}/{w['final_prob']:.3f} #{w['rank']}" for w in watch)


def _strongest(attribution: list[dict[str, Any]], n: int = 3) -> str:
    """The n tokens with the largest attribution scores by size, signed."""
    strongest = sorted(attribution, key=lambda a: -abs(a["score"]))[:n]
    return "  ".join(f"{visible(a['text'])}@{a['position']} {a['score']:+.2f}" for a in strongest)


def print_score(doc: dict[str, Any], console: Console) -> None:
    """One row per scored token, then the total log-probability and the perplexity."""
    from tokenviz.render.units import probability

    m = doc["model"]
    console.print(Text(safe_text(f"{m['name']} · {m['device']} · {m['dtype']}"), style="bold"))
    first = doc["first"]
    console.print(Text(f"first token {visible(first['text'])} ({first['id']}) is read, not predicted", style="dim"))
    table = Table(header_style="bold")
    for name in ("#", "token", "id", "logprob", "p", "rank", "entropy", "the model's top 3 there"):
        table.add_column(name, justify="right" if name in ("#", "id", "logprob", "p", "rank", "entropy") else "left")
    for t in doc["tokens"]:
        top = "  ".join(f"{visible(c['text'])} {probability(c['prob'])}" for c in t["top"][:3])
        table.add_row(
            str(t["index"]),
            Text(visible(t["text"]), style="dim" if t.get("template") else ""),
            str(t["id"]),
            f"{t['logprob']:.3f}",
            probability(t["prob"]),
            str(t["rank"]),
            f"{t['entropy']:.2f}",
            Text(top),
        )
    console.print(table)
    console.print(
        Text(
            f"total log-probability {doc['logprob']:.3f} over {len(doc['tokens'])} tokens · "
            f"perplexity {doc['perplexity']:.3f}",
            style="bold",
        )
    )
