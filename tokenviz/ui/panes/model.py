"""Model info view: what the model is and how tokenviz runs it, kept on screen (not a toast)."""

from __future__ import annotations

import textwrap

from rich.text import Text

from tokenviz.contract.engine import Capability, in_order
from tokenviz.contract.records import ModelInfo
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection

VALUES_LEAST = 24  # cells a value needs beside the names; with fewer, it goes under its name


class ModelPane(ScrollPane):
    TITLE = "model"

    def draw(self, selection: Selection) -> None:
        i = selection.info
        if i is None:
            return
        # The scrollbar's room kept: a long view shows one, and its lines are not wrapped again under it.
        self.body.update(two_columns(rows_of(i), self.content_size.width - self.styles.scrollbar_size_vertical))


def rows_of(i: ModelInfo) -> list[tuple[str, str]]:
    """The view's rows: each a name and its value."""
    return [
        ("name", i.name),
        ("architecture", i.architecture),
        *shape_rows(i),
        ("vocabulary", f"{i.vocab} tokens"),
        ("context", f"{i.context} positions"),
        ("positions", i.positions),
        ("chat template", "yes (--chat, or the editor's switch)" if i.chat_template else "none"),
        ("attention runs", i.attention),
        ("device, dtype", f"{i.device}, {i.dtype}"),
        *([("runtime", i.runtime)] if i.runtime else []),
        *([("quantization", i.quantization)] if i.quantization else []),
        *([("memory", i.memory)] if i.memory else []),
        *([("placement", i.placement)] if i.placement else []),
        *([("queries kept", i.queries_kept)] if i.queries_kept else []),
        *([("steps run", i.compiled)] if i.compiled else []),
        *i.details,
        *([("engine", engine_line(i))] if i.capabilities else []),
        *((f"no {capability}", why) for capability, why in i.lacks_why),
        *([("distribution", i.distribution)] if i.distribution else []),
    ]


def two_columns(rows: list[tuple[str, str]], width: int) -> Text:
    """Each row's name, and its value wrapped at words to `width` under itself, never under the names (UX
    7's finding 22: a wrapped row's lines began at the names' column). Where the names leave the values
    less than VALUES_LEAST cells, each value goes on the lines under its name, indented."""
    names = max(len(name) for name, _ in rows) + 2
    beside = width - names >= VALUES_LEAST
    indent = names if beside else 2
    text = Text()
    for name, value in rows:
        text.append(f"{name:<{names}}" if beside else f"{name}\n{' ' * indent}", style="bold")
        lines = textwrap.wrap(value, max(width - indent, 10), break_on_hyphens=False) or [""]
        text.append(f"\n{' ' * indent}".join(lines) + "\n")
    return text


def shape_rows(i: ModelInfo) -> list[tuple[str, str]]:
    """The model's shape, where its engine knows it (a served model's is known where its insides are read)."""
    if not i.layers:
        return []
    experts = [("experts", f"{i.experts} in each mixture-of-experts layer (R shows the routing)")] if i.experts else []
    return [
        ("layers", str(i.layers)),
        ("attention heads", attention_heads(i)),
        ("hidden size", str(i.hidden)),
        *experts,
        ("embeddings", "input and output tied" if i.tied_embeddings else "input and output separate"),
    ]


def engine_line(i: ModelInfo) -> str:
    """What the engine can do and what it cannot (see contract.engine), but what a row of its own says
    it lacks and why (ModelInfo.lacks_why): a key whose view needs more says so."""
    can = ", ".join(in_order(i.capabilities)) or "nothing"
    said = {capability for capability, _ in i.lacks_why}
    cannot = [c.value for c in Capability if c.value not in i.capabilities and c.value not in said]
    return f"can: {can}" + (f"; not: {', '.join(cannot)}" if cannot else "")


def attention_heads(i: ModelInfo) -> str:
    """The query heads and what the KV cache keeps for them."""
    if i.latent_kv:
        return f"{i.heads} query heads over one latent of {i.head_dim} a position (multi-head latent attention)"
    shared = f"{i.kv_heads} key/value head{'s' if i.kv_heads != 1 else ''} of {i.head_dim}"
    return f"{i.heads} query heads sharing {shared}"
