"""The app's figures: frames, autoplay with every pane drawn, keys, and the start in a real terminal."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.anchors import PROMPT, bare_ready_s
from bench.engine import random_ids
from bench.timing import paired_ratio
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Play, Reset, Start
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.worker.engine_thread import EngineWorker


class BurstClock(EngineWorker):
    """An engine worker that notes when each autoplay burst ends, on the engine's own thread: the
    model's pace, not how soon a poll sees it."""

    def start(self, post) -> None:
        self.ended, self.started, self.ended_at = threading.Event(), 0.0, 0.0

        def noting(snapshot):
            if snapshot.stop_reason and not snapshot.playing and not self.ended.is_set():
                self.ended_at = time.perf_counter()
                self.ended.set()
            post(snapshot)

        super().start(noting)

    def begin(self) -> None:
        """Call just before submitting Play."""
        self.ended.clear()
        self.started = time.perf_counter()

    def seconds(self) -> float:
        self.ended.wait()
        return self.ended_at - self.started


def app_autoplay(loaded, context: int = 2000, tokens: int = 16, rounds: int = 8) -> dict:
    """Autoplay at `context` tokens in the app, every pane drawn at 200x60, against headless
    autoplay through another engine thread on the same model. Bursts of `tokens` alternate between
    the two, each from the same prefilled prompt, and the ratio is the median of the pairs' ratios:
    this 2-core machine's pace drifts by a third between runs a minute apart."""
    from tokenviz.ui.app import TokenvizApp

    text = " ".join(["The Eiffel Tower is located in Paris, the capital of France."] * (context // 8))
    prompt = loaded.tokenizer.decode(loaded.tokenizer(text)["input_ids"][:context])
    settings = SamplingSettings(temperature=0, max_new_tokens=tokens)
    headless, shown = [], []

    async def alternate() -> None:
        bare = BurstClock(lambda progress: ModelRunner(loaded), settings, prompt)
        ready = threading.Event()

        def note_ready(snapshot) -> None:
            if snapshot.state == "ready":
                ready.set()

        bare.start(note_ready)
        app_worker = BurstClock(lambda progress: ModelRunner(loaded), settings, prompt)
        app = TokenvizApp(app_worker)
        async with app.run_test(size=(200, 60)) as pilot:
            journey = app.journey
            while journey.snapshot is None or journey.snapshot.state not in ("ready", "error") or not ready.is_set():
                await pilot.pause(0.05)
            await pilot.pause(0.5)  # the first frame drawn
            for _ in range(rounds):
                bare.begin()
                bare.submit(Play(on=True))
                headless.append(bare.seconds())
                bare.submit(Reset())  # back to the prompt, its prefill kept
                app_worker.begin()
                journey.submit(Play(on=True))
                await asyncio.to_thread(app_worker.ended.wait)
                shown.append(app_worker.seconds())
                journey.submit(Reset())
                await pilot.pause(0.3)  # the app draws the reset before the next burst
        bare.stop()

    asyncio.run(alternate())
    h, a = statistics.median(headless), statistics.median(shown)
    ratios = [h_i / a_i for h_i, a_i in zip(headless, shown, strict=True)]
    return {"headless_tok_s": tokens / h, "app_tok_s": tokens / a, "ratios": ratios, "ratio": statistics.median(ratios)}


def key_frame(loaded, context: int = 500, presses: int = 8) -> dict:
    """During autoplay in the app at 200x60, from a settings key (T) to the frame that shows its
    change: the median over `presses`. Frames are spaced during autoplay; one that answers a key is not."""
    from textual import events

    from tokenviz.ui.app import TokenvizApp

    prompt = random_ids(loaded, context)
    latencies: list[float] = []

    async def run() -> None:
        worker = EngineWorker(lambda progress: ModelRunner(loaded), SamplingSettings(max_new_tokens=10**6), "")
        app = TokenvizApp(worker)
        async with app.run_test(size=(200, 60)) as pilot:
            journey = app.journey
            while journey.snapshot is None or journey.snapshot.state not in ("ready", "error"):
                await pilot.pause(0.05)
            journey.submit(Start(prompt=loaded.tokenizer.decode(prompt)))
            while journey.snapshot_drawn is None or journey.snapshot_drawn.handled < worker.submitted:
                await pilot.pause(0.05)
            await pilot.press("a")
            for i in range(presses):
                await pilot.pause(0.5)
                temperature = journey.snapshot_drawn.settings.temperature
                key = "T" if i % 2 == 0 else "t"
                pressed = time.perf_counter()
                driver = app._driver
                assert driver is not None
                driver.send_message(events.Key(key, key))  # as a terminal delivers it (pilot.press waits for idle)
                while journey.snapshot_drawn.settings.temperature == temperature:
                    await pilot.pause(0.002)
                latencies.append(time.perf_counter() - pressed)
            await pilot.press("a")

    asyncio.run(run())
    return {"median_ms": statistics.median(latencies) * 1000, "max_ms": max(latencies) * 1000}


def ui_growth(loaded, long: int = 6000, short: int = 50, steps: int = 12, rounds: int = 5) -> dict:
    """The pane update of `frame` at 200x60 with a journey of `long` tokens against one of `short`:
    drawing follows what is on screen, so the ratio stays near 1 (rounds interleaved and paired: three
    runs of three pooled rounds gave 1.01, 1.08 and 1.25, three more 0.98-1.09)."""
    text = " ".join(["The Eiffel Tower is located in Paris, the capital of France."] * (long // 8))
    ids = loaded.tokenizer(text)["input_ids"]
    size = (200, 60)
    journeys = {n: frame_journeys(loaded, size, steps, ids[: n - steps]) for n in (short, long)}
    times: dict[int, list[float]] = {short: [], long: []}
    for _ in range(rounds):
        for n in (short, long):
            times[n].append(asyncio.run(frame_ms(journeys[n], size)))
    a, b = statistics.median(times[short]), statistics.median(times[long])
    return {f"{short}_ms": a, f"{long}_ms": b, "ratio": paired_ratio(list(zip(times[long], times[short])))}


def snapshot_growth(loaded, long: int = 6000, short: int = 50, steps: int = 12) -> dict:
    """The engine thread's snapshot of a journey after each step (snapshot_of: its chips, text, records),
    with a prompt of `long` tokens against one of `short`, and at `long` against the whole path's two texts
    decoded at once, as each snapshot did before (journey.decoded_text). What still grows with the path is
    a comparison of its ids with the ones kept (tens of microseconds at 6,000 tokens)."""
    from tokenviz.worker.snapshots import snapshot_of

    text = " ".join(["The Eiffel Tower is located in Paris, the capital of France."] * (long // 8))
    ids = loaded.tokenizer(text)["input_ids"]
    times: dict[int, list[float]] = {}
    for n in (short, long):
        session = Session(ModelRunner(loaded), SamplingSettings(seed=1, max_new_tokens=10**6))
        session.start(ids[: n - steps])
        snapshot_of(session)  # (the chips and texts made once whole, as the first frame does)
        times[n] = []
        for _ in range(steps):
            session.step()
            start = time.perf_counter()
            snapshot_of(session)
            times[n].append(time.perf_counter() - start)
        if n == long:
            start = time.perf_counter()
            for _ in range(steps):
                session.engine.decode(session.ids), session.engine.decode(session.generated_ids)
            whole_ms = (time.perf_counter() - start) / steps * 1000
    a, b = statistics.median(times[short]) * 1000, statistics.median(times[long]) * 1000
    return {
        f"{short}_ms": a,
        f"{long}_ms": b,
        "ratio": b / a,
        f"whole_text_{long}_ms": whole_ms,
        "over_whole_text": b / whole_ms,
    }


def frame(loaded, sizes=((200, 60), (80, 24)), steps: int = 12, prompt: str | list[int] = PROMPT) -> dict:
    """Time for the app to update every pane for one step (panes redrawn, screen composed), with
    the attention rows the pane shows at each size in every snapshot, as the engine sends them."""
    return {
        f"{w}x{h}_ms": asyncio.run(frame_ms(frame_journeys(loaded, (w, h), steps, prompt), (w, h))) for w, h in sizes
    }


def frame_journeys(loaded, size: tuple[int, int], steps: int, prompt: str | list[int]) -> list:
    """`steps` snapshots of a journey from `prompt`, each with the attention rows the pane shows at `size`."""
    from tokenviz.contract.attention import causal_view, window
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(loaded), SamplingSettings(seed=1, max_new_tokens=10**6))
    session.start(prompt)
    layer = loaded.info.layers - 1
    rows = (size[1] - 3) * 2
    snapshots = []
    for i in range(steps):
        session.step()
        n = session.engine.kv_len
        queries = window(n - 1, n, rows)  # the newest rows
        view = causal_view(layer, queries, session.attention(queries, [layer])[0])
        snapshots.append(dataclasses.replace(snapshot_of(session, seq=i + 1), attention=view))
    return snapshots


async def frame_ms(snapshots: list, size: tuple[int, int], rounds: int = 3) -> float:
    """The median UI-thread CPU time to show one step: from a snapshot's arrival, through the panes
    drawn, Textual's messages and screen update, to the terminal's text for it made. CPU time, not
    wall time: what else the machine runs does not count. The steps are shown `rounds` times over (as
    new snapshots) for more samples."""
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.recording import RecordingWorker

    app = TokenvizApp(RecordingWorker(snapshots[0]))
    times = []
    gc.collect()  # a collection owed by building the journeys is not a frame's cost
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        screen = app.journey
        composed = screen._compositor_refresh
        written: list[asyncio.Future] = []

        def refreshed() -> None:  # Textual's screen update ends here: note the time for the frame
            composed()
            if written and not written[-1].done():
                written[-1].set_result(time.thread_time())

        screen._compositor_refresh = refreshed  # type: ignore[method-assign]  # Textual's own: timed, not changed
        display = app._display

        def displayed(screen, update) -> None:  # headless: the terminal's text is made, not sent
            display(screen, update)
            if update is not None:
                update.render_segments(app.console)

        app._display = displayed  # type: ignore[method-assign,assignment]  # as above
        seq = snapshots[-1].seq
        for _ in range(rounds):
            for snap in snapshots[1:]:
                seq += 1
                await pilot.pause()
                written.append(asyncio.get_running_loop().create_future())
                started = time.thread_time()
                screen.snapshot = dataclasses.replace(snap, seq=seq)
                screen._apply_snapshot()
                times.append(await written[-1] - started)
    return statistics.median(times) * 1000


def cold_start(timeout: float = 60, rounds: int = 3) -> dict:
    """Process start to first frame, and to ready (model loaded, prompt prefilled), in a real terminal;
    ready against a bare process's load (see bare_ready_s) run right after it, the median of the
    rounds' ratios (single starts a run apart gave 1.02 to 1.29)."""
    if shutil.which("tmux") is None:
        return {"skipped": "tmux not installed"}
    firsts, pairs = [], []
    for _ in range(rounds):
        first, ready = app_start(timeout)
        firsts.append(first)
        if ready is not None:
            pairs.append((ready, bare_ready_s()))
    known = [first for first in firsts if first is not None]
    return {
        "first_frame_s": statistics.median(known) if known else None,
        "ready_s": statistics.median(ready for ready, _ in pairs) if pairs else None,
        "bare_ready_s": statistics.median(bare for _, bare in pairs) if pairs else None,
        "ratio": paired_ratio(pairs) if len(pairs) == rounds else None,
    }


def app_start(timeout: float) -> tuple[float | None, float | None]:
    """Seconds from starting `tokenviz` in tmux to its first frame and to model ready (None: not seen)."""
    name = f"tvbench{os.getpid()}"
    started = time.perf_counter()
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "48", f"{sys.executable} -m tokenviz; sleep 5"],
        check=True,
    )
    first = ready = None
    try:
        while time.perf_counter() - started < timeout and ready is None:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            now = time.perf_counter() - started
            if first is None and "tokens" in screen:
                first = now
            if "ready · step 0" in screen:
                ready = now
            time.sleep(0.02)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    return first, ready


# A process in a terminal (a pty) as the app's starts: the command line imported (the baseline), then the
# terminal's watcher started (system.terminal_guard); what each took, and the memory of each process.
GUARDED = """
import json, os, time
from pathlib import Path

def rss(pid):
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024

started = time.perf_counter()
import tokenviz.cli.commands
imported = time.perf_counter()
from tokenviz.system.terminal_guard import guard_terminal, release
guard_terminal()
guarded = time.perf_counter()
children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
time.sleep(1.0)  # (the watcher's interpreter started and waiting)
watcher = rss(children[0]) if children else None
release()
print(json.dumps({"import_s": imported - started, "guard_s": guarded - imported, "app_rss": rss(os.getpid()),
                  "watcher_rss": watcher}), file=open(os.environ["GUARD_OUT"], "w"))
"""


def terminal_guard(rounds: int = 5) -> dict:
    """What giving the terminal back costs (system.terminal_guard): the time the watcher's start adds to the
    app's, against the time the app's start spends importing its command line (the same run, the same
    process), and the watcher's memory against that process's before any model loads (so an upper bound
    of its share of the app's)."""
    import json
    import pty
    import tempfile

    runs = []
    for _ in range(rounds):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            main, terminal = pty.openpty()
            try:
                subprocess.run(
                    [sys.executable, "-c", GUARDED],
                    stdin=terminal,
                    stdout=terminal,
                    stderr=terminal,
                    env={**os.environ, "GUARD_OUT": out.name},
                    timeout=120,
                    check=True,
                )
            finally:
                os.close(main)
                os.close(terminal)
            runs.append(json.loads(Path(out.name).read_text()))
    guard = statistics.median(r["guard_s"] for r in runs)
    imported = statistics.median(r["import_s"] for r in runs)
    watcher = statistics.median(r["watcher_rss"] for r in runs if r["watcher_rss"])
    app = statistics.median(r["app_rss"] for r in runs)
    return {
        "guard_ms": guard * 1000,
        "import_ms": imported * 1000,
        "ratio": guard / imported,
        "watcher_mb": watcher / 2**20,
        "app_before_model_mb": app / 2**20,
        "memory_ratio": watcher / app,
    }
