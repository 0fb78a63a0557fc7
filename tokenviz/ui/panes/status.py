"""Status line: model, device, step, timings, KV cache, engine state."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tokenviz.contract.snapshot import Snapshot
from tokenviz.render.units import human_bytes


class StatusLine(Static):
    DEFAULT_CSS = "StatusLine { height: 1; background: $panel; color: $foreground; padding: 0 1; }"

    def show(self, s: Snapshot) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        state = s.state if not s.stop_reason else f"stopped: {s.stop_reason}"
        if s.info is None or s.state == "prefilling":
            bar = f" {s.progress:.0%}" if s.progress is not None else ""
            text.append(f"{s.state}{bar} · {s.message}")
            self.update(text)
            return
        latest = s.latest
        parts = [f"step {len(s.chips) - s.prompt_len}", f"pos {len(s.chips)}"]
        if latest is not None:
            parts += [f"fwd {latest.forward_ms:.1f} ms"]
            if s.tokens_per_s:
                parts += [f"{s.tokens_per_s:.1f} tok/s"]
            parts += [f"KV {latest.kv_len} tok {human_bytes(latest.kv_bytes)}"]
        parts += [s.info.name, s.info.device, s.info.dtype]
        text.append(state, style="bold")
        text.append(" · " + " · ".join(parts))
        self.update(text)
