"""Timing pane: prefill against per-step decode, tokens per second, the last steps' times."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from rich.text import Text

from tokenviz.contract.records import StepRecord
from tokenviz.contract.snapshot import Took
from tokenviz.render.sparkline import sparkline
from tokenviz.render.units import elapsed
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection


class TimingPane(ScrollPane):
    TITLE = "timing"  # (a ScrollPane: at 80x24 its last lines are below the pane, and PgDn brings them)

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        if not s.records:
            return
        bar_color = self.theme_colors.bar
        prefill = s.records[0]
        decode = [r.forward_ms for r in s.records[1:]]
        sampling = [r.decision.ms for r in s.records]
        text = Text()  # wrapped to the pane: no figure is cut
        if selection.info.requests:  # a step is a request: its time and the network's
            text = served_timing(s.records, s.tokens_per_s, sampling, self.size.width, bar_color)
            self.body.update(took_line(s.took).append_text(text).append_text(lens_cost(s.lens_ms, remote=True)))
            return
        text.append_text(took_line(s.took))
        text.append(
            f"prefill: {elapsed(prefill.forward_ms)} for {len(prefill.input_ids)} prompt tokens at once "
            f"({prefill.forward_ms / max(len(prefill.input_ids), 1):.2f} ms per token)\n",
            style="bold",
        )
        if decode:
            mean = statistics.mean(decode)
            text.append(
                f"decode: {elapsed(mean)} per step (one token each, reusing the cache)\n",
                style="bold",
            )
            if s.tokens_per_s and s.forward_tokens_per_s:  # of the same steps: all work is never faster
                text.append(
                    f"the last {s.rate_steps} steps: {s.forward_tokens_per_s:.1f} tokens/s from the forward pass "
                    f"alone, {s.tokens_per_s:.1f} with all work included (the engine's rate)\n"
                )
            text.append(f"sampling: {statistics.mean(sampling):.2f} ms per decision (every stage recorded)\n")
            placed = by_place(s.records[1:])
            if placed:
                text.append(f"by where the weights live, per step: {placed}\n")
            own = [r.unsteered.ms for r in s.records[1:] if r.unsteered]
            if own:  # interventions on: the model's own distribution beside them costs a pass of its own
                text.append(
                    f"interventions: + {statistics.mean(own):.1f} ms per step for the model's own distribution "
                    "(one more forward pass of the token fed, over the unhooked model's own KV cache)\n"
                )
            width = max(self.size.width - 4, 10)
            text.append(
                f"last {min(len(decode), width)} steps (forward ms, {min(decode[-width:]):.1f}-"
                f"{max(decode[-width:]):.1f}):\n"
            )
            text.append(sparkline(decode, width), style=bar_color)
        else:
            text.append("step to see decode times (space)", style="dim")
        self.body.update(text.append_text(lens_cost(s.lens_ms, remote=False)))


def took_line(took: Took | None) -> Text:
    """The last step's whole time on the engine thread, split into its parts (the status line's 'took')."""
    if took is None:
        return Text()
    parts = " · ".join(f"{name} {elapsed(ms)}" for name, ms in took.parts)
    return Text(f"last step, whole: {elapsed(took.ms)}{f' = {parts}' if parts else ''}\n", style="bold")


def lens_cost(lens_ms: tuple[int, float] | None, remote: bool) -> Text:
    """The logit lens's own cost, last computed (a position seen before is shown again at no cost)."""
    if lens_ms is None:
        return Text()
    position, ms = lens_ms
    work = "the server's activations, the head applied here" if remote else "its own pass and the head over its layers"
    return Text(f"\nlens: {elapsed(ms)} at position {position}, its own cost ({work})")


def served_timing(
    records: tuple[StepRecord, ...], tokens_per_s: float | None, sampling: list[float], width: int, color: str
) -> Text:
    """A served model's times: each request's latency, network and the server's queue included, not a
    forward pass (the server's own time is not returned)."""
    prefill, steps = records[0], [r.forward_ms for r in records[1:]]
    text = Text()
    text.append(
        f"prompt: {elapsed(prefill.forward_ms)} for its {len(prefill.input_ids)} tokens' log-probabilities and the "
        "first draw (requests to the server, network included; its forward passes are not timed apart)\n",
        style="bold",
    )
    if not steps:
        text.append("step to see each request's latency (space)", style="dim")
        return text
    text.append(f"each step: one request, {elapsed(statistics.mean(steps))} on average (time to its one token)\n")
    if tokens_per_s:
        text.append(f"engine rate, all work included: {tokens_per_s:.1f} tokens/s\n")
    text.append(f"recomputing the stages here: {statistics.mean(sampling):.2f} ms per decision\n")
    shown = max(width - 4, 10)
    text.append(f"last {min(len(steps), shown)} requests (ms, {min(steps[-shown:]):.1f}-{max(steps[-shown:]):.1f}):\n")
    text.append(sparkline(steps, shown), style=color)
    return text


def by_place(records: Iterable[StepRecord]) -> str:
    """'cuda:0 12.1 ms · cpu 40.3 ms · disk 80.2 ms': a spread model's mean forward time in each place
    over `records` ('' for a model in one place)."""
    totals: dict[str, list[float]] = {}
    for record in records:
        for place, ms in record.place_ms:
            totals.setdefault(place, []).append(ms)
    return " · ".join(f"{place} {statistics.mean(times):.1f} ms" for place, times in totals.items())
