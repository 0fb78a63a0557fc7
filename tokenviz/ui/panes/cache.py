"""KV cache pane: what the cache holds per layer, how it grew, what a rewind kept, and a check
that the cached step equals a full recompute."""

from __future__ import annotations

from rich.text import Text

from tokenviz.contract.commands import Verify
from tokenviz.render.bars import bar
from tokenviz.render.sparkline import sparkline
from tokenviz.render.units import human_bytes
from tokenviz.ui.panes.base import Run, ScrollPane, pending_note
from tokenviz.ui.selection import Selection

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}  # a cached number, by the model's dtype


class CachePane(ScrollPane):
    TITLE = "KV cache"

    def action_verify(self) -> None:
        """Recompute the journey without the cache and compare (see Verify); again, with its answer shown,
        back to attention."""
        journey = self.journey
        s = journey.snapshot
        if journey.showing("cache", Verify) and s is not None and s.result(Verify) is not None:
            journey.open_view("attention")
            return
        journey.submit(Verify())
        journey.open_view("cache")

    def draw(self, selection: Selection) -> None:
        s, info, latest = selection.snapshot, selection.info, selection.snapshot.latest
        if latest is None:
            return
        bar_color = self.theme_colors.bar
        tokens, total = latest.kv_len, latest.kv_bytes
        per_layer = total // max(info.layers, 1)
        per_token = total // max(tokens, 1)
        element = ELEMENT_BYTES.get(info.dtype) or per_token // max(2 * info.layers * info.kv_heads * info.head_dim, 1)
        uniform = per_token == 2 * info.layers * info.kv_heads * info.head_dim * element  # every layer alike
        text = Text(no_wrap=True, overflow="crop")
        text.append(
            f"{tokens} tokens held · {human_bytes(total)} in all · {human_bytes(per_token)} per token\n", style="bold"
        )
        v = s.result(Verify)
        if v is not None:
            verdict = "rounding level: the cache is exact" if v.max_logit_diff < 1e-3 else "LARGER than rounding"
            text.append(
                f"verify @ position {v.position}: max |Δlogit| {v.max_logit_diff:.2e}, "
                f"max |Δattention| {v.max_attention_diff:.2e}\n",
                style="bold",
            )
            text.append(f"same argmax: {'yes' if v.argmax_agrees else 'NO'} · {verdict}\n", style="bold")
            if v.compared_with:
                text.append(f"compared with {v.compared_with}\n")
        elif s.live:  # a recording keeps no verification
            waiting = "press v to recompute this step without the cache and compare"
            text.append_text(pending_note(selection, waiting, "verify", Run(Verify, "verify")))
            text.append("\n")
        if info.latent_kv:  # the rotary key's width is not in the info: the sum is the cache's own
            text.append(
                f"per layer: a latent of {info.head_dim} dims and a shared rotary key × {tokens} tokens"
                f" = {human_bytes(per_layer)}  (×{info.layers} layers)\n"
                f"multi-head latent attention: each layer expands the latent into its {info.heads} heads' "
                "keys and values as it attends, so the cache holds far less than one key and value a head\n"
            )
        elif uniform:
            text.append(
                f"per layer: keys + values × {info.kv_heads} KV heads × {info.head_dim} dims × {tokens} tokens"
                f" × {element} B = {human_bytes(per_layer)}  (×{info.layers} layers)\n"
            )
        else:  # Gemma 4's global layers have larger heads than its sliding ones
            text.append(
                f"its layers differ: the first keeps keys + values × {info.kv_heads} KV heads × {info.head_dim} "
                f"dims a token; {human_bytes(per_layer)} a layer on average (×{info.layers} layers)\n"
            )
        if info.kv_heads < info.heads and not info.latent_kv:
            text.append(
                f"grouped-query attention: {info.heads} query heads share {info.kv_heads} KV heads, "
                f"so the cache is {info.heads // info.kv_heads}× smaller than one KV head per query head\n"
            )
        width = max(self.size.width - 14, 10)
        for layer in range(min(info.layers, 3) if uniform or info.latent_kv else 0):
            text.append(f"layer {layer:>3} ")
            text.append(bar(1.0, width // 2), style=bar_color)
            text.append(f" {human_bytes(per_layer)}\n")
        if info.layers > 3 and (uniform or info.latent_kv):
            text.append(f"… the same for all {info.layers} layers\n", style="dim")
        growth = [r.kv_bytes for r in s.records]
        text.append(f"growth over {len(growth)} forward passes: ")
        text.append(sparkline(growth, width - 10) + "\n", style=bar_color)
        event = s.cache_event
        if event is not None:
            text.append(
                f"last rewind/branch kept the shared prefix of {event.kept} positions and dropped "
                f"{event.dropped}: only those are recomputed\n"
            )
        text.rstrip()
        self.body.update(text)
