"""Status line: model, device, step, timings, KV cache, engine state.

While a long job runs (a prefill, attribution, beams, ...), its progress takes the state's place:
"N of M · about T left (Escape cancels)". Items drop by priority when the line is too narrow: the
state, step and position stay longest, then device and dtype; the model's name goes first.
"""

from __future__ import annotations

import dataclasses
import time

from rich.cells import cell_len
from rich.text import Text
from textual.visual import VisualType
from textual.widgets import Static

from tokenviz.contract.interventions import briefly
from tokenviz.contract.snapshot import CANCELS, Snapshot
from tokenviz.render.columns import phrase_cut
from tokenviz.render.units import duration, elapsed, human_bytes

BUSY = ("loading", "prefilling")  # states whose work of unknown length shows its elapsed time


class StatusLine(Static):
    DEFAULT_CSS = "StatusLine { height: 1; background: $panel; color: $foreground; padding: 0 1; }"
    STARTING = "starting…"  # before the worker's first frame

    _shown: Snapshot | None = None
    _cancelling = False  # Escape pressed during a job: said at once, until a frame shows the job gone
    _since: tuple[str, float] = ("", 0.0)  # work of unknown length on the line, and when it began
    _frame_steps = 0  # the steps autoplay took between the frame before and this one

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)  # the elapsed time of a load or compile that says no fraction

    def _tick(self) -> None:
        if self._shown is not None and self._shown.progress is None and self._shown.state in BUSY:
            self.show(self._shown)

    def _elapsed(self, message: str) -> str:
        if message != self._since[0]:
            self._since = (message, time.monotonic())
        return duration(time.monotonic() - self._since[1])

    def cancelling(self) -> None:
        """Escape was pressed: if a job is running, say at once that it is being cancelled."""
        if self._shown is not None and CANCELS in (self._shown.message or ""):
            self._cancelling = True
            self.show(self._shown)

    def update(self, content: VisualType = "", *, layout: bool = False) -> None:
        """One line, sized by the CSS: no layout for a new text."""
        super().update(content, layout=layout)

    def show(self, s: Snapshot) -> None:
        if s is not self._shown:  # a new frame: how far autoplay went since the one before
            before = self._shown
            playing = before is not None and before.playing and s.playing
            self._frame_steps = len(s.chips) - len(before.chips) if playing and before is not None else 0
        self._shown = s
        job = CANCELS in (s.message or "")
        self._cancelling = self._cancelling and job
        if self._cancelling:  # the job's own line would say "Escape cancels" until it stops
            s = dataclasses.replace(s, message=s.message.replace(CANCELS, "(cancelling: it stops at its next step)"))
        text = Text(no_wrap=True, overflow="ellipsis")
        state = s.state if not s.stop_reason else f"stopped: {s.stop_reason}"
        if s.info is None or s.state == "prefilling":  # the time so far first, then the message cut at a phrase
            head = f"{s.state} {s.progress:.0%}" if s.progress is not None else s.state
            if s.progress is None and s.state in BUSY:
                head += f" · {self._elapsed(s.message)}"
            message, cancels = (s.message or ""), ""
            if message.endswith(CANCELS):  # what Escape does is never the part cut
                message, cancels = message.removesuffix(CANCELS).rstrip(), " " + CANCELS
            width = self.content_size.width or 10**6  # (not laid out yet: all of it)
            room = width - cell_len(head) - 3 - cell_len(cancels)
            said = f" · {phrase_cut(message, max(room, 1))}{cancels}" if message else ""
            text.append(head + said)
            self.update(text)
            return
        if s.message and s.live:  # a job's progress, or a continuation's (a recording's says what a footer does)
            state = s.message
        if s.playing and s.pace_s:
            state += f" (a step every {s.pace_s:g} s)"
        elif s.playing and self._frame_steps > 1:  # a frame costs more than a step: each shows several
            state += f" (+{self._frame_steps} since the last frame)"
        if not s.live:  # a recording: every figure is what was computed when it was made, nothing runs now
            state = f"recording · {state}"
        items = status_items(s)
        width = self.content_size.width or 10**6  # not laid out yet: keep everything
        while items and cell_len(state) + sum(cell_len(said[0]) + 3 for _, said in items) > width:
            least = max(items, key=lambda item: item[0])  # the least important gives way first:
            if len(least[1]) > 1:  # to its shorter way of saying it, where it has one
                items[items.index(least)] = (least[0], least[1][1:])
            else:
                items.remove(least)
        text.append(state, style="bold")
        text.append("".join(f" · {said[0]}" for _, said in items))
        self.update(text)

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(self._shown)


def status_items(s: Snapshot) -> list[tuple[float, tuple[str, ...]]]:
    """The status line's items after its state, each with its priority (the highest gives way first
    where the line is too narrow) and its ways of saying it, the fullest first."""
    assert s.info is not None
    latest = s.latest
    items: list[tuple[float, tuple[str, ...]]] = [
        (0, (f"step {len(s.chips) - s.prompt_len}",)),
        (0.75, (f"{len(s.chips)} tokens",)),  # the tokens pane's subtitle counts them too
    ]
    if s.why:  # why the text looks as it does, once it has stopped: kept before the figures, not the step
        more = f" +{len(s.why) - 1}" if len(s.why) > 1 else ""
        items.append((0.5, (f"why: {s.why[0].brief}{more}", f"why: {s.why[0].symptom}{more}")))
    on = [i for i, active in s.interventions if active]
    if on:  # the model is not itself: say so among the first, each intervention where they fit
        ways = (", ".join(i.label for i in on), briefly(on), on[0].label + (f" +{len(on) - 1}" if len(on) > 1 else ""))
        items.append((0, tuple(dict.fromkeys(ways))))
    served = bool(s.info.requests)  # a step is a request, network included; its cache unknown here
    if latest is not None:
        then = "" if s.live else "recorded "
        pass_ = f"{then}{'request' if served else 'fwd'} {elapsed(latest.forward_ms)}"
        took = s.took if s.live else None  # the last step's whole time, its views' passes in it (parts: i)
        items.append((3, (f"took {elapsed(took.ms)} ({pass_})", f"took {elapsed(took.ms)}") if took else (pass_,)))
        if s.tokens_per_s:
            items.append((2, (f"{then}{s.tokens_per_s:.1f} tok/s decode",)))
        if not served:
            items.append((4, (f"KV {latest.kv_len} tok {human_bytes(latest.kv_bytes)}",)))
    items += [(5, (s.info.name,)), (1, (s.info.device,)), (1, (s.info.dtype,))]
    return items
