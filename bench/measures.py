"""The benchmark: what watching costs over running the model bare, as ratios measured side by side
in one process on the same model, device and dtype.

    python -m bench [--device auto|cpu|cuda] [--dtype ...] [--shape 8B] [--only M,M] [--quick] [--out bench/results]

Prints a table and writes bench/results/<device>[-<shape>]-<date>.json. `--shape 8B` measures a
Llama-3-8B-shaped model with random weights made on the device (bench/shaped.py) instead of the
bundled one: the engine's step, prefill, autoplay and device memory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import psutil
import torch

from bench.shaped import shaped_model, weights_bytes
from tokenviz.backends.transformers.loading import (
    LoadedModel,
    convert_gguf,
    gguf_cache_dir,
    load_model,
    resolve_device,
)
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Play, Reset, Start
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import HeadAblation, Intervention
from tokenviz.contract.paths import bundled_gguf
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.worker.engine import EngineWorker

T = TypeVar("T")
PROMPT = "The Eiffel Tower is located in"
BUDGETS = {
    "step_overhead": ("engine step / bare sdpa step, short context", "<=", 1.05),
    "step_2048": ("engine step / bare sdpa step, 2048 context", "<=", 1.05),
    "prefill_2048": ("engine prefill / bare sdpa forward, 2048 tokens", "<=", 1.15),
    "prefill_4096": ("engine prefill / bare sdpa forward, 4096 tokens", "<=", 1.15),
    "peak_4096_gb": ("peak RSS over the bare model's prefill (last logits only), 4096 tokens, GB", "<=", 0.25),
    "attention_2048_ms": ("attention view of one layer, 2048 context, ms", "<=", 50.0),
    "autoplay": ("autoplay tok/s / generate() tok/s", ">=", 1.0),
    "growth": ("step at 2048 / step at 32, over the bare step's own 2048 / 32", "<=", 1.05),
    "frame_200x60_ms": ("pane update at 200x60, ms", "<=", 16.0),
    "ui_growth": ("pane update, 6000-token journey / 50-token journey", "<=", 1.2),
    "app_autoplay": ("autoplay in the app / headless, 2000 context", ">=", 0.9),
    "cold_start_s": ("start to first interactive frame, s", "<=", 1.0),
    "model_ready": ("start to model ready / a bare process's import, load and forward of the same model", "<=", 1.2),
    "history_mb_per_1000": ("step records MB per 1000 steps (the kept query states are bounded apart)", "<=", 64.0),
    "beams_2000": ("beam search (B), 2000 context / 50 context", "<=", 1.5),
    "key_frame_ms": ("a settings key during autoplay to its frame, ms", "<=", 100.0),
    "offload_same": ("half the layers on the disk: the same tokens (1 = yes)", ">=", 1.0),
    "refusal_s": ("a 70B config refused, s", "<=", 10.0),
    "refusal_gb": ("a 70B config refused, peak RSS GB", "<=", 1.0),
    "grammar_step": ("engine step with a JSON-schema grammar / without", "<=", 1.10),
    "intervention_step": ("engine step with one head ablated (own distribution kept) / without", "<=", 2.2),
    "device_peak": ("peak device memory / (weights + KV cache), 2048-token prefill and steps", "<=", 1.10),
    "compiled_autoplay": ("autoplay with --compile tok/s / eager generate() tok/s", ">=", 2.0),
    "compiled_over_static": ("autoplay with --compile tok/s / static-cache generate() tok/s", ">=", 0.9),
    "trace_long": ("tokenviz trace, 4,200-token prompt / a bare process's load and forward (processes)", "<=", 1.15),
    "served_step": ("a served step / a bare one-token request at the same context (--endpoint)", "<=", 1.2),
    "served_lens_step": ("a served step with the lens open / one without (--endpoint, vllm-lens)", "<=", 1.5),
}
# What only a GPU has (CUDA graphs): shown on a CPU, not judged there (a CPU's step is its matmuls).
GPU_BUDGETS = frozenset({"compiled_autoplay", "compiled_over_static"})
VIEW_ROWS = 114  # query rows the attention pane shows at 200x60


def in_thread(run: Callable[[], T]) -> T:
    """`run()` in a thread of its own, joined: every measure, and generate() beside autoplay, so the
    main thread never runs the model, as in the app, where the engine thread alone does. GNU OpenMP
    (torch's CPU threads) keeps a team of threads for each thread that has run a parallel region, and
    its workers wait for the next region spinning only while there are no more of them than cores;
    past that they sleep, and each region wakes them (sdpa over one token: 0.074 ms in a thread made
    after the main thread had run it, 0.013 ms before, on this 2-core machine). A thread's team goes
    with it, so measures run one after another in threads of their own each see one team."""
    out: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:  # (raised again in the caller's thread)
            failed.append(exc)

    thread = threading.Thread(target=target, name="bench")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def transformers_runner(session: Session) -> ModelRunner:
    """The session's engine as the transformers backend it is here (the bench reads its query store)."""
    assert isinstance(session.runner, ModelRunner)
    return session.runner


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_model(loaded: LoadedModel, source: str, device: torch.device):
    """The same weights with transformers' default fast attention (sdpa), no attention outputs."""
    from transformers import AutoModelForCausalLM

    from tokenviz.backends.transformers.loading import quiet

    with quiet():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=loaded.model.dtype, attn_implementation="sdpa")
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers wraps .to


@torch.inference_mode()
def bare_decoder(model, ids: list[int], device: torch.device) -> Callable[[], None]:
    """The bare model's greedy decode after prefilling `ids`, with a DynamicCache and argmax and
    nothing else: each call is one step."""
    from transformers import DynamicCache

    from tokenviz.backends.transformers.cache import with_cache

    cache = DynamicCache(config=model.config)
    out = model(torch.tensor([ids], device=device), **with_cache(model, cache), use_cache=True, logits_to_keep=1)
    token = out.logits[0, -1].argmax().view(1, 1)

    @torch.inference_mode()
    def step() -> None:
        nonlocal token
        out = model(token, **with_cache(model, cache), use_cache=True)
        token = out.logits[0, -1].argmax().view(1, 1)

    return step


def started_session(
    loaded: LoadedModel, ids: list[int], grammar: Grammar | None = None, interventions: tuple[Intervention, ...] = ()
) -> tuple[Session, float]:
    """A greedy journey on `ids` (under `grammar` and with `interventions`, if given), prefilled as the
    app's engine does (the prompt's predictions come after), and its prefill's seconds."""
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=10**6, grammar=grammar))
    if interventions:
        session.set_interventions(interventions, context=ids)
    started = time.perf_counter()
    session.start(ids, defer_predictions=True)
    return session, time.perf_counter() - started


def seconds_of(step: Callable[[], object], device: torch.device) -> float:
    """One call of `step`, the device's queued work included."""
    sync(device)
    started = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - started


def bare_steps(model, ids: list[int], steps: int, device: torch.device) -> list[float]:
    """Per-step seconds of the bare model's greedy decode (see bare_decoder)."""
    step = bare_decoder(model, ids, device)
    return [seconds_of(step, device) for _ in range(steps)]


def engine_steps(
    loaded: LoadedModel,
    ids: list[int],
    steps: int,
    grammar: Grammar | None = None,
    interventions: tuple[Intervention, ...] = (),
) -> tuple[float, list[float]]:
    """(prefill seconds, per-step seconds) of the engine, greedy (see started_session)."""
    session, prefill = started_session(loaded, ids, grammar, interventions)
    device = session.runner.device
    return prefill, [seconds_of(session.step, device) for _ in range(steps)]


def paired_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median over rounds of each round's a / b: a round's two measures are taken seconds apart,
    and this 2-core machine's pace drifts more than that between rounds (medians of all of a's and
    all of b's moved a ratio by 0.05-0.2 between identical runs)."""
    return statistics.median(a / b for a, b in pairs)


@torch.inference_mode()
def steps_in_turn(loaded: LoadedModel, bare, ids: list[int], steps: int, device: torch.device) -> dict:
    """The engine's greedy decode steps and the bare model's (a DynamicCache and argmax, nothing else)
    taken in turn from the same prompt, which goes first alternating: (engine, bare) seconds of each
    pair, the first 2 left out as warm-up, and the engine's prefill. Pairs a step apart see the same
    machine: rounds of many steps each had this 2-core machine's pace drift between them (a bare step at
    2,048 tokens 67 ms in one run and 72 ms, the same as at 32, in the next)."""
    session, prefill = started_session(loaded, ids)
    bare_step = bare_decoder(bare, ids, device)
    pairs = []
    for i in range(steps + 2):
        seconds = {
            name: seconds_of(step, device)
            for name, step in (("engine", session.step), ("bare", bare_step))[:: 1 if i % 2 else -1]
        }
        pairs.append((seconds["engine"], seconds["bare"]))
    return {"pairs": pairs[2:], "prefill": prefill}


def step_overhead(loaded, bare, device, steps: int, rounds: int = 5) -> dict:
    """The engine's step against the bare step, short context: steps in turn (see steps_in_turn),
    the median of the pairs' ratios."""
    ids = loaded.tokenizer(PROMPT)["input_ids"]
    pairs = [pair for _ in range(rounds) for pair in steps_in_turn(loaded, bare, ids, steps, device)["pairs"]]
    e_ms, b_ms = (statistics.median(times) * 1000 for times in zip(*pairs))
    return {"engine_ms": e_ms, "bare_ms": b_ms, "ratio": paired_ratio(pairs)}


# Long enough that a greedy journey does not complete it within the steps measured.
NAMES_SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 64}


def grammar_step(loaded, steps: int, rounds: int = 3) -> dict:
    """The engine's step with a JSON-schema grammar stage against the same engine's step without one,
    rounds interleaved: what following the grammar (the matcher, its mask, the stage) adds to a step."""
    ids = loaded.tokenizer("Some names, as a JSON list:")["input_ids"]
    grammar = Grammar("json-schema", json.dumps(NAMES_SCHEMA), "names.json")
    constrained, plain = [], []
    for _ in range(rounds):
        plain += engine_steps(loaded, ids, steps + 2)[1][2:]
        constrained += engine_steps(loaded, ids, steps + 2, grammar)[1][2:]
    g, p = statistics.median(constrained) * 1000, statistics.median(plain) * 1000
    return {"grammar_ms": g, "plain_ms": p, "ratio": g / p, "added_ms": g - p}


def intervention_step(loaded, steps: int, rounds: int = 3) -> dict:
    """The engine's step with one head ablated against the same engine's step without: the hook, and
    the model's own distribution kept beside it (a second pass over its own KV cache), rounds
    interleaved. After the first step, the unhooked model's own pass alone."""
    ids = loaded.tokenizer(PROMPT)["input_ids"]
    ablated, plain = [], []
    for _ in range(rounds):
        plain += engine_steps(loaded, ids, steps + 2)[1][2:]
        ablated += engine_steps(loaded, ids, steps + 2, interventions=(HeadAblation(0, 0),))[1][2:]
    a, p = statistics.median(ablated) * 1000, statistics.median(plain) * 1000
    return {"intervened_ms": a, "plain_ms": p, "ratio": a / p}


def generate_seconds(bare, ids, tokens: int, device, cache: str = "dynamic") -> tuple[float, list[int]]:
    """generate() of `tokens` greedy tokens, its prefill in: with transformers' default cache
    ("dynamic") or its static cache ("static"), whose forward generate() compiles on a GPU (CUDA
    graphs, transformers' own fastest path) and runs eager on a CPU."""
    static = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.inference_mode():
        sync(device)
        started = time.perf_counter()
        out = bare.generate(ids, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens, **static)
        sync(device)
    return time.perf_counter() - started, out[0, ids.shape[1] :].tolist()


class StaticGenerate:
    """generate() with the static cache, each run in one thread kept for it: on a GPU, torch keeps the
    CUDA graphs it records per thread (graph trees), so a fresh thread each run would record them
    again. Made warm: `warm_s` is its first two runs, the compile and the recording on a GPU (once
    per length and process), which the rounds after do not pay."""

    def __init__(self, bare, ids, tokens: int, device) -> None:
        from tokenviz.backends.transformers.compiled_step import graph_trees_in_this_thread

        self.run = lambda: generate_seconds(bare, ids, tokens, device, "static")
        self.pool = ThreadPoolExecutor(1, "bench-static", graph_trees_in_this_thread if device.type == "cuda" else None)
        started = time.perf_counter()
        self()
        self()
        self.warm_s = time.perf_counter() - started

    def __call__(self) -> tuple[float, list[int]]:
        return self.pool.submit(self.run).result()

    def close(self) -> None:
        self.pool.shutdown()


def autoplay_seconds(loaded, tokens: int, prompt: str = PROMPT) -> tuple[float, list[int]]:
    """Headless autoplay through the engine thread, exactly as the app drives it."""
    snapshots, done = [], threading.Event()

    def post(snapshot):
        snapshots.append(snapshot)
        if snapshot.stop_reason and not snapshot.playing:
            done.set()

    worker = EngineWorker(lambda progress: loaded, SamplingSettings(temperature=0, max_new_tokens=tokens), prompt)
    worker.start(post)
    while not snapshots or snapshots[-1].state not in ("ready", "error"):  # loaded and prefilled
        time.sleep(0.01)
    started = time.perf_counter()
    worker.submit(Play(on=True))
    done.wait()
    seconds = time.perf_counter() - started
    worker.stop()
    last = snapshots[-1]
    return seconds, [c.id for c in last.chips[last.prompt_len :]]


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
        bare = BurstClock(lambda progress: loaded, settings, prompt)
        ready = threading.Event()

        def note_ready(snapshot) -> None:
            if snapshot.state == "ready":
                ready.set()

        bare.start(note_ready)
        app_worker = BurstClock(lambda progress: loaded, settings, prompt)
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


def beams(loaded, long: int = 2000, short: int = 50, width: int = 3, steps: int = 10, rounds: int = 3) -> dict:
    """B, the beam search the app runs (from the journey's KV cache), at a `long` context against a
    `short` one; and, as the before figure, the same search fed the whole long context again."""
    from tokenviz.contract.commands import Beams
    from tokenviz.journey.views import compute

    def seconds(n: int, from_cache: bool) -> float:
        session = Session(ModelRunner(loaded), SamplingSettings(temperature=0))
        session.start(random_ids(loaded, n))
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            if from_cache:  # as the app's B computes it: through the view's spec
                compute(session, Beams(width, steps))
            else:
                session.runner.beam_search(session.ids, width, steps, from_cache=False)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    short_s, long_s = seconds(short, True), seconds(long, True)
    return {
        f"{short}_s": short_s,
        f"{long}_s": long_s,
        f"{long}_fed_again_s": seconds(long, False),
        "ratio": long_s / short_s,
    }


def key_frame(loaded, context: int = 500, presses: int = 8) -> dict:
    """During autoplay in the app at 200x60, from a settings key (T) to the frame that shows its
    change: the median over `presses`. Frames are spaced during autoplay; one that answers a key is not."""
    from textual import events

    from tokenviz.ui.app import TokenvizApp

    prompt = random_ids(loaded, context)
    latencies: list[float] = []

    async def run() -> None:
        worker = EngineWorker(lambda progress: loaded, SamplingSettings(max_new_tokens=10**6), "")
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


def offload(source: str | None = None, steps: int = 8, device: str = "cpu") -> dict:
    """A model with about half its weights given to the device by --max-memory and the rest
    offloaded (on the CPU: to the disk; on a GPU: to the CPU), against the same model whole on the
    device: the cost of a step (medians) and whether the tokens are the same. `source`: a model
    directory (the bundled model's converted one by default)."""
    from tokenviz.contract.placement import Placement

    source = source or str(gguf_cache_dir(bundled_gguf()))
    whole = load_model(source, device=device, dtype="float32")
    size = weights_bytes(whole.model)
    ids = whole.tokenizer(PROMPT)["input_ids"]
    limits = (f"cpu={size // 2}",) if device == "cpu" else (f"0={size // 2}", "cpu=100GB")
    with tempfile.TemporaryDirectory() as folder:
        placement = Placement("auto", limits, folder)
        spread = load_model(source, device=device, dtype="float32", placement=placement)
        placed: dict[str, str | int] = getattr(spread.model, "hf_device_map", {})
        on_disk = sum(1 for where in placed.values() if where == "disk")
        on_cpu = sum(1 for where in placed.values() if where == "cpu") if device != "cpu" else 0
        runs = {}
        for name, loaded in (("whole", whole), ("offloaded", spread)):
            session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=10**6))
            session.start(ids)
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                session.step()
                times.append(time.perf_counter() - started)
            runs[name] = (statistics.median(times), list(session.ids))
    return {
        "parts_on_disk": on_disk,
        "parts_on_cpu": on_cpu,
        "placement": spread.info.placement,
        "whole_step_ms": runs["whole"][0] * 1000,
        "offloaded_step_ms": runs["offloaded"][0] * 1000,
        "ratio": runs["offloaded"][0] / runs["whole"][0],
        "same_tokens": runs["whole"][1] == runs["offloaded"][1],
    }


def refusal() -> dict:
    """A directory holding a Llama-3-70B-shaped config (and no weights worth reading): from start to
    the one-line refusal, and the process's peak memory."""
    from bench.checkpoints import SHAPES, run_with_peak, sparse_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        sparse_checkpoint(Path(folder), SHAPES["70B"])
        started = time.perf_counter()
        code, stderr, peak = run_with_peak(
            [sys.executable, "-m", "tokenviz", "trace", "hi", "--model", folder, "--device", "cpu"]
        )
        seconds = time.perf_counter() - started
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    return {
        "seconds": seconds,
        "peak_rss_gb": peak / 2**20,
        "refused": code == 2 and len(errors) == 1 and "needs" in errors[0] and "Traceback" not in stderr,
        "error": errors[0] if errors else stderr[-500:],
    }


def autoplay(loaded, bare, device, tokens: int, rounds: int = 5) -> dict:
    """Headless autoplay against generate() of the same tokens with the default cache and with the
    static cache (see generate_seconds), rounds interleaved and paired, each in a thread of its own
    (see in_thread). `ratio` is over the default cache's; `ratio_over_static` over the static one's."""
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids.to(device)
    autoplay_seconds(loaded, 8)  # warm-up
    in_thread(lambda: generate_seconds(bare, ids, 4, device))
    static_generate = StaticGenerate(bare, ids, tokens, device)
    played, generated, static = [], [], []
    for _ in range(rounds):
        played.append(autoplay_seconds(loaded, tokens))
        generated.append(in_thread(lambda: generate_seconds(bare, ids, tokens, device)))
        static.append(static_generate())
    static_generate.close()
    ours = played[-1][1]
    a, g, s = (statistics.median(t for t, _ in runs) for runs in (played, generated, static))
    return {
        "autoplay_tok_s": tokens / a,
        "generate_tok_s": tokens / g,
        "ratio": paired_ratio([(g_s, a_s) for (a_s, _), (g_s, _) in zip(played, generated)]),
        "same_tokens": ours == generated[-1][1],
        "static_generate_tok_s": tokens / s,
        "ratio_over_static": paired_ratio([(s_s, a_s) for (a_s, _), (s_s, _) in zip(played, static)]),
        "static_same_tokens": ours == static[-1][1],
        "static_warm_s": static_generate.warm_s,
    }


def compiled_autoplay(loaded, bare, device, tokens: int, steps: int, rounds: int = 3) -> dict:
    """--compile: the model's decode step compiled (CUDA graphs on a GPU). Its autoplay against eager
    generate() (the issue's budget), and its engine step against the bare eager step and the engine's
    eager step, rounds interleaved; the compile's own seconds, once."""
    from tokenviz.backends.transformers.compiled_step import compiled

    started = time.perf_counter()
    fast = compiled(loaded, lambda message, fraction: None)
    compile_s = time.perf_counter() - started
    played = autoplay(fast, bare, device, tokens, rounds)
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    compiled_steps, eager_steps, plain = [], [], []
    for _ in range(rounds):
        compiled_steps += engine_steps(fast, prompt, steps + 2)[1][2:]
        eager_steps += engine_steps(loaded, prompt, steps + 2)[1][2:]
        plain += bare_steps(bare, prompt, steps + 2, device)[2:]
    c, e, b = (statistics.median(t) * 1000 for t in (compiled_steps, eager_steps, plain))
    return {
        "compile_s": compile_s,
        **played,
        "step_ms": c,
        "eager_step_ms": e,
        "bare_step_ms": b,
        "step_ratio": c / b,
    }


def random_ids(loaded: LoadedModel, n: int) -> list[int]:
    return torch.randint(0, loaded.info.vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@torch.inference_mode()
def growth(loaded, bare, device, lengths=(32, 512, 2048, 4096), steps: int = 12, rounds: int = 3) -> dict:
    """Per length of context: the engine's decode step against the bare sdpa step (steps in turn: see
    steps_in_turn), and the engine's prefill against one bare forward pass of the same prompt (the
    fastest of the rounds). How the step grows from 32 to 2048 tokens of context is set against how
    the bare step grows (the model's own attention over more keys): the engine's ratio to the bare
    step at 2048 over its ratio at 32, which is `ratio` over `bare_ratio` measured a step apart."""
    out: dict = {}
    for n in lengths:
        ids = random_ids(loaded, n)
        pairs, prefills, forwards = [], [], []
        for _ in range(rounds):
            turn = steps_in_turn(loaded, bare, ids, steps, device)
            pairs += turn["pairs"]
            prefills.append(turn["prefill"])
            sync(device)
            started = time.perf_counter()
            bare(torch.tensor([ids], device=device))
            sync(device)
            forwards.append(time.perf_counter() - started)
        engine, plain = zip(*pairs)
        out[str(n)] = {
            "step_ms": statistics.median(engine) * 1000,
            "bare_step_ms": statistics.median(plain) * 1000,
            "step_ratio": paired_ratio(pairs),
            "engine_prefill_ms": min(prefills) * 1000,
            "bare_forward_ms": min(forwards) * 1000,
            "prefill_ratio": min(prefills) / min(forwards),
        }
    far = "2048" if "2048" in out else str(lengths[-1])
    out["ratio"] = out[far]["step_ms"] / out[str(lengths[0])]["step_ms"]
    out["bare_ratio"] = out[far]["bare_step_ms"] / out[str(lengths[0])]["bare_step_ms"]
    out["ratio_over_bare"] = out[far]["step_ratio"] / out[str(lengths[0])]["step_ratio"]
    return out


def attention_view(loaded, n: int = 2048, rounds: int = 5) -> dict:
    """Milliseconds to compute the rows the attention pane shows at 200x60, after a prefill of `n`
    tokens: the newest rows of a layer (queries kept: the usual case, and every layer switch), and
    rows at the start whose queries were dropped (fed again first)."""
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0))
    session.start(random_ids(loaded, n))
    rows = min(VIEW_ROWS, n)
    newest, oldest = range(n - rows, n), range(0, rows)

    def ms(rows: range, layer: int, fresh: bool = False) -> float:
        times = []
        for _ in range(rounds):
            if fresh:
                transformers_runner(session).queries.drop_from(0)
            started = time.perf_counter()
            session.attention(rows, [layer])
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    return {
        "newest_rows_ms": ms(newest, loaded.info.layers - 1),
        "another_layer_ms": ms(newest, 0),
        "rows_fed_again_ms": ms(oldest, 0, fresh=True),
        "rows": rows,
        "context": n,
        "queries_kept_mb": transformers_runner(session).queries.nbytes / 2**20,
    }


PEAK_SCRIPT = """
import sys, torch
from pathlib import Path
from tokenviz.backends.transformers.loading import load_model
loaded = load_model({source!r}, device="cpu")
ids = torch.randint(0, loaded.info.vocab, ({n},), generator=torch.Generator().manual_seed(1)).tolist()
status = Path("/proc/self/status")
def rss(field):
    line = next(x for x in status.read_text().splitlines() if x.startswith(field))
    return int(line.split()[1]) * 1024
before = rss("VmRSS:")
Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here: loading is not the run
if sys.argv[1] == "engine":
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session
    from tokenviz.backends.transformers.runner import ModelRunner
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0))
    session.start(ids, defer_predictions=True)
    session.score_prompt()  # (the predictions made afterwards count: the peak is the whole job's)
    print(session.runner.queries.nbytes, session.runner.queries.budget)
else:  # as generate() prefills: sdpa, the cache, the last position's logits
    loaded.model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        loaded.model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
print(rss("VmHWM:") - before)
"""


def peak_memory(n: int = 4096, source: str | None = None) -> dict:
    """How far RSS rises above the loaded model while a fresh process prefills `n` tokens through
    the engine (and makes every prompt position's prediction), against one that prefills them as
    generate() does (CPU, Linux). The query states the attention view keeps are counted in the
    engine's peak and reported apart, with their budget.

    Both processes run with glibc's mmap threshold fixed, so a freed large tensor goes back to the
    system and the peak is what the process held: with the threshold glibc moves by itself, freed
    memory stays in the heap, and identical runs of either process peaked up to 0.15 GB apart. The
    same measure under glibc's default is reported beside it."""
    peaks, queries = {}, []
    fixed = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    for malloc, env in (("", fixed), ("default_malloc_", None)):
        for kind in ("model", "engine"):
            done = subprocess.run(
                [sys.executable, "-c", PEAK_SCRIPT.format(n=n, source=source), kind],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            numbers = [int(x) for x in done.stdout.split()[-3:]]
            peaks[malloc + kind] = numbers[-1] / 2**30
            if kind == "engine":
                queries = numbers[:2]
    return {
        "tokens": n,
        "model_run_peak_gb": peaks["model"],
        "engine_run_peak_gb": peaks["engine"],
        "extra_gb": peaks["engine"] - peaks["model"],
        "default_malloc_extra_gb": peaks["default_malloc_engine"] - peaks["default_malloc_model"],
        "queries_kept_gb": queries[0] / 2**30,
        "queries_budget_gb": queries[1] / 2**30,
    }


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
        n = session.runner.kv_len
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


BARE_READY = """
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({source!r}, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained({source!r})
with torch.inference_mode():
    model(**tokenizer({prompt!r}, return_tensors="pt"))
"""


def bare_ready_s(source: str | None = None) -> float:
    """What model ready is measured against: process start to the end of a bare process that imports
    transformers, loads the same model directory and runs one forward over the same prompt. Importing
    torch and transformers alone is most of it on a small CPU: a fixed budget cannot be met, a ratio can."""
    source = source or str(gguf_cache_dir(bundled_gguf()))
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", BARE_READY.format(source=source, prompt=PROMPT)], check=True, capture_output=True
    )
    return time.perf_counter() - started


BARE_TRACE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({source!r}, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained({source!r})
ids = tokenizer(open({text!r}).read(), return_tensors="pt").input_ids
with torch.inference_mode():
    model(ids, logits_to_keep=1)  # (as generate() prefills: the last position's logits only)
print(ids.shape[1])
"""


def trace_long(loaded, source: str | None = None, n: int = 4200, rounds: int = 3) -> dict:
    """`tokenviz trace` of a prompt of about `n` tokens, one step, against a bare process that imports
    transformers, loads the same model directory and runs one forward over the same text, process
    start to end, in turn; the median of the rounds' ratios. What trace adds to the model's own pass."""
    source = source or str(gguf_cache_dir(bundled_gguf()))
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "prompt.txt"
        words = len(loaded.tokenizer(PROMPT)["input_ids"])
        text.write_text(" ".join([PROMPT] * (n // words + 1)))  # (text an argument can carry)
        trace = [sys.executable, "-m", "tokenviz", "trace", "--model", source, "--dtype", "float32", "--device", "cpu"]
        trace += ["--steps", "1", "--temperature", "0", "--json", text.read_text()]
        bare = [sys.executable, "-c", BARE_TRACE.format(source=source, text=str(text))]
        pairs, tokens = [], 0
        for _ in range(rounds):
            started = time.perf_counter()
            done = subprocess.run(trace, check=True, capture_output=True, text=True)
            traced = time.perf_counter() - started
            started = time.perf_counter()
            tokens = int(subprocess.run(bare, check=True, capture_output=True, text=True).stdout.split()[-1])
            pairs.append((traced, time.perf_counter() - started))
    return {
        "tokens": tokens,
        "traced_tokens": len(json.loads(done.stdout)["prompt"]),
        "trace_s": statistics.median(t for t, _ in pairs),
        "bare_s": statistics.median(b for _, b in pairs),
        "ratio": paired_ratio(pairs),
    }


def conversion() -> dict:
    """The one-time GGUF -> safetensors conversion, into a scratch cache."""
    gguf = bundled_gguf()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"], saved = tmp, os.environ.get("XDG_CACHE_HOME")
        try:
            started = time.perf_counter()
            convert_gguf(gguf, gguf_cache_dir(gguf), lambda m, f: None)
            return {"gguf_conversion_s": time.perf_counter() - started}
        finally:
            if saved is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = saved


def memory(loaded, steps: int) -> dict:
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    runner = ModelRunner(loaded)
    runner.eos_ids = set()  # measure a full `steps` of history: keep going past an end-of-text token
    session = Session(runner, SamplingSettings(seed=2, max_new_tokens=10**6))
    session.start(PROMPT)
    for _ in range(steps):
        session.step()
    assert len(session.generated_ids) == steps
    gc.collect()
    grown = process.memory_info().rss - before
    sizes = [len(pickle.dumps(r, protocol=5)) for r in session.records]
    kept = transformers_runner(session).queries.nbytes  # the query states kept for the view: bounded, not per step
    half = len(sizes) // 2
    kv = session.runner.kv_bytes
    last = session.records[-1]
    scale = 1000 / steps
    return {
        "steps": steps,
        "rss_growth_mb_per_1000": grown * scale / 2**20,
        # The history grows by its records; the query states kept for the view do not grow with the
        # journey but fill a budget set by the free memory (stated in the model info), so they are
        # reported beside it, with that budget.
        "history_mb_per_1000": sum(sizes) * scale / 2**20,
        "records_mb_first_half": sum(sizes[:half]) / 2**20,  # linear: the second half costs the same
        "records_mb_second_half": sum(sizes[half:]) / 2**20,
        "queries_kept_mb": kept / 2**20,
        "queries_budget_mb": transformers_runner(session).queries.budget / 2**20,
        "kv_cache_mb_per_1000": kv * scale / 2**20,
        "step_record_kb_at_end": len(pickle.dumps(last, protocol=5)) / 1024,
        "step_record_kb_mean": sum(sizes) / len(sizes) / 1024,
    }


def device_peak(loaded, n: int = 2048, steps: int = 32) -> dict:
    """On a GPU: the most device memory allocated while the engine prefills `n` tokens and steps,
    against the weights plus the KV cache they leave (what the model itself cannot do without)."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=10**6))
    session.start(random_ids(loaded, n))
    for _ in range(steps):
        session.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    weights, kv = weights_bytes(loaded.model), session.runner.kv_bytes
    queries = transformers_runner(session).queries.nbytes
    return {
        "peak_gb": peak / 1e9,
        "weights_gb": weights / 1e9,
        "kv_cache_gb": kv / 1e9,
        "queries_kept_gb": queries / 1e9,
        "ratio": peak / (weights + kv),
        "ratio_with_queries_kept": peak / (weights + kv + queries),  # the attention view's own budget
    }


def served(url: str, api_key, insecure_http: bool = False, tokens: int = 32, rounds: int = 3) -> dict:
    """A served journey (trace --endpoint) against the same server: its time per token against the
    server's own streamed generation of the same tokens, and a step against a bare one-token request at
    the same context (rounds interleaved). The server's, network included: no model runs here. Every
    request goes through the app's own client (`connect`: the token's rules, no redirect, deadlines)."""
    from tokenviz.served.endpoint import connect
    from tokenviz.served.journey import ServedJourney, served_model_name

    endpoint = connect(url, api_key, insecure_http)
    model = served_model_name(endpoint, None)
    journey = ServedJourney(endpoint, model, SamplingSettings(temperature=0, max_new_tokens=tokens))
    stepped, bare, streamed, first = [], [], [], []
    for _ in range(rounds):  # (the first round also asks the server for each new token's text, once)
        journey.start(PROMPT)
        t0 = time.perf_counter()
        journey.run()
        n = len(journey.steps)  # (fewer than `tokens` where the model ends the text)
        stepped.append((time.perf_counter() - t0) / n)
        ids = list(journey.ids)
        body = {"model": model, "max_tokens": 1, "temperature": 0, "logprobs": journey.top_n}
        t0 = time.perf_counter()
        for end in range(len(journey.prompt_ids), len(ids)):  # the same contexts, a bare request each
            endpoint.post("/completions", {**body, "prompt": ids[:end], "return_tokens_as_token_ids": True})
        bare.append((time.perf_counter() - t0) / n)
        seconds, to_first, streamed_ids = _streamed(endpoint, model, journey.prompt_ids, n)
        streamed.append(seconds / n)
        first.append(to_first)
    step_ms, bare_ms, stream_ms = (statistics.median(x) * 1e3 for x in (stepped, bare, streamed))
    return {
        "step_ms": step_ms,
        "bare_request_ms": bare_ms,
        "streamed_ms_per_token": stream_ms,
        "time_to_first_token_ms": statistics.median(first) * 1e3,
        "ratio": step_ms / bare_ms,
        "stepped_over_streamed": step_ms / stream_ms,
        "same_tokens": streamed_ids == ids[len(journey.prompt_ids) :],
    }


def served_lens(url: str, api_key, model_files: str, insecure_http: bool = False, tokens: int = 16) -> dict:
    """The app's path on a served model (Session on the served engine): a step with no internal view
    open against a bare one-token request at the same context, and a step with the lens open (the step
    and the lens's request at its position, as the app asks it) against the plain step. Needs the
    vllm-lens plugin on the server and the model's directory (its head)."""
    from tokenviz.backends.engines import engine_of
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.transformers.loading import load_tokenizer
    from tokenviz.journey.session import Session
    from tokenviz.served.endpoint import connect
    from tokenviz.served.journey import served_model_name

    endpoint = connect(url, api_key, insecure_http)
    here = load_tokenizer(model_files)  # (as `--tokenizer DIR` gives it: no request for a token's text)
    engine = ServedEngine(endpoint, served_model_name(endpoint, None), local_tokenizer=here, model_files=model_files)
    if engine.internals is None:
        return {"skipped": engine.info.internals}
    plain: list[float] = []
    with_lens: list[float] = []
    bare: list[float] = []
    body = {"model": engine.model, "max_tokens": 1, "temperature": 0, "logprobs": engine.top_n}
    for lens in (False, True, False, True):  # (interleaved: the server's load shared alike)
        session = Session(engine_of(engine), SamplingSettings(temperature=0, max_new_tokens=10**6))
        session.start(PROMPT)
        for _ in range(tokens):
            t0 = time.perf_counter()
            session.step()
            if lens:
                session.analyses.inspect(len(session.ids) - 2)  # (the lens of the step just taken)
            (with_lens if lens else plain).append(time.perf_counter() - t0)
            if not lens:
                t0 = time.perf_counter()
                endpoint.post("/completions", {**body, "prompt": session.ids[:-1], "return_tokens_as_token_ids": True})
                bare.append(time.perf_counter() - t0)
    step_ms, lens_ms, bare_ms = (statistics.median(x) * 1e3 for x in (plain, with_lens, bare))
    return {
        "step_ms": step_ms,
        "bare_request_ms": bare_ms,
        "step_with_lens_ms": lens_ms,
        "step_over_bare": step_ms / bare_ms,
        "ratio": lens_ms / step_ms,
    }


def _streamed(endpoint, model: str, ids: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(seconds, seconds to the first token, the token ids) of the server's own streamed generation."""
    from tokenviz.contract.reading import parse_json
    from tokenviz.served.endpoint import EndpointError

    body = {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0, "stream": True}
    body |= {"logprobs": 0, "return_tokens_as_token_ids": True, "ignore_eos": True}
    got, to_first = [], None
    t0 = time.perf_counter()
    for line in endpoint.stream_lines("/completions", body):
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = parse_json(line[len(b"data: ") :], f"{endpoint.host}'s streamed answer", EndpointError, finite=True)
        for name in chunk["choices"][0]["logprobs"]["tokens"]:
            to_first = to_first if to_first is not None else time.perf_counter() - t0
            got.append(int(name.removeprefix("token_id:")))
    return time.perf_counter() - t0, to_first or 0.0, got


def verdicts(r: dict) -> dict:
    growth, view = r.get("growth", {}), r.get("attention_view")
    values = {
        "step_overhead": r.get("step_overhead", {}).get("ratio"),
        "step_2048": growth.get("2048", {}).get("step_ratio"),
        "prefill_2048": growth.get("2048", {}).get("prefill_ratio"),
        "prefill_4096": growth.get("4096", {}).get("prefill_ratio"),
        "peak_4096_gb": r.get("peak_memory", {}).get("extra_gb"),
        "attention_2048_ms": max(view["newest_rows_ms"], view["another_layer_ms"]) if view else None,
        "autoplay": r.get("autoplay", {}).get("ratio"),
        "growth": growth.get("ratio_over_bare"),
        "frame_200x60_ms": r.get("frame", {}).get("200x60_ms"),
        "ui_growth": r.get("ui_growth", {}).get("ratio"),
        "app_autoplay": r.get("app_autoplay", {}).get("ratio"),
        "cold_start_s": r.get("cold_start", {}).get("first_frame_s"),
        "model_ready": r.get("cold_start", {}).get("ratio"),
        "history_mb_per_1000": r.get("memory", {}).get("history_mb_per_1000"),
        "beams_2000": r.get("beams", {}).get("ratio"),
        "key_frame_ms": r.get("key_frame", {}).get("median_ms"),
        "offload_same": (lambda o: None if o is None else float(o["same_tokens"]))(r.get("offload")),
        "refusal_s": r.get("refusal", {}).get("seconds"),
        "refusal_gb": r.get("refusal", {}).get("peak_rss_gb"),
        "grammar_step": r.get("grammar_step", {}).get("ratio"),
        "intervention_step": r.get("intervention_step", {}).get("ratio"),
        "device_peak": r.get("device_peak", {}).get("ratio"),
        "compiled_autoplay": r.get("compiled_autoplay", {}).get("ratio"),
        "compiled_over_static": r.get("compiled_autoplay", {}).get("ratio_over_static"),
        "trace_long": r.get("trace_long", {}).get("ratio"),
        "served_step": r.get("served", {}).get("ratio"),
        "served_lens_step": r.get("served_lens", {}).get("ratio"),
    }
    out = {}
    on_gpu = bool(r.get("machine", {}).get("gpu"))
    for key, (label, op, limit) in BUDGETS.items():
        value = values[key]
        judged = value is not None and (on_gpu or key not in GPU_BUDGETS)
        ok = (value <= limit if op == "<=" else value >= limit) if judged else None
        out[key] = {"label": label, "value": value, "budget": f"{op} {limit}", "met": ok}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--shape", choices=["8B"], help="a Llama-3-8B-shaped model made on the device, not the bundled one"
    )
    parser.add_argument("--only", default="", help="the measures to run, by name, comma-separated (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, not for the record)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--endpoint",
        help="an OpenAI-compatible server for the served measure (trace --endpoint); "
        "python -m tokenviz.cli.start_vllm starts one on the bundled model",
    )
    parser.add_argument("--api-key-env", help="with --endpoint: the environment variable holding its API key")
    parser.add_argument(
        "--insecure-http", action="store_true", help="with --endpoint: send the key over plain http to another host"
    )
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    torch.manual_seed(0)
    if args.shape:
        loaded, bare = in_thread(lambda: shaped_model(resolve_device(args.device)))
    else:
        loaded = in_thread(lambda: load_model(None, device=args.device, dtype=args.dtype))
        source = str(gguf_cache_dir(bundled_gguf()))
        bare = in_thread(lambda: bare_model(loaded, source, next(loaded.model.parameters()).device))
    device = next(loaded.model.parameters()).device
    steps = 8 if args.quick else 32
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        },
        "model": loaded.info.to_json(),
    }
    console.print(f"[bold]tokenviz bench[/] on {loaded.info.name}, {device}, {loaded.info.dtype}")
    measures = [
        ("autoplay", lambda: autoplay(loaded, bare, device, 32 if args.quick else 128)),
        ("step_overhead", lambda: step_overhead(loaded, bare, device, steps)),
        ("growth", lambda: growth(loaded, bare, device, lengths=(32, 2048) if args.shape else (32, 512, 2048, 4096))),
        ("attention_view", lambda: attention_view(loaded)),
        ("device_peak", lambda: device_peak(loaded)),
        ("peak_memory", peak_memory),
        ("frame", lambda: frame(loaded)),
        ("ui_growth", lambda: ui_growth(loaded, long=1000 if args.quick else 6000)),
        ("app_autoplay", lambda: app_autoplay(loaded, context=500 if args.quick else 2000)),
        ("cold_start", cold_start),
        ("conversion", conversion),
        ("memory", lambda: memory(loaded, 100 if args.quick else 1000)),
        ("beams", lambda: beams(loaded, long=500 if args.quick else 2000)),
        ("key_frame", lambda: key_frame(loaded)),
        ("offload", lambda: offload(device=device.type)),
        ("refusal", refusal),
        ("grammar_step", lambda: grammar_step(loaded, steps)),
        ("intervention_step", lambda: intervention_step(loaded, steps)),
        ("trace_long", lambda: trace_long(loaded, n=1000 if args.quick else 4200)),
        ("compiled_autoplay", lambda: compiled_autoplay(loaded, bare, device, 32 if args.quick else 128, steps)),
    ]
    if args.endpoint:  # (the server's model is what it serves: the bundled one, for figures beside these)
        from tokenviz.served.endpoint import ApiKey

        key = ApiKey(env=args.api_key_env)
        measures.append(("served", lambda: served(args.endpoint, key, args.insecure_http, 8 if args.quick else 32)))
        files = str(gguf_cache_dir(bundled_gguf()))  # (the server's model: the bundled one's directory)
        measures.append(
            ("served_lens", lambda: served_lens(args.endpoint, key, files, args.insecure_http, 8 if args.quick else 16))
        )
    chosen = set(filter(None, args.only.split(",")))
    if args.shape:  # what a model of that size adds to the bundled model's figures: the engine's cost
        chosen = chosen or {"autoplay", "step_overhead", "growth", "attention_view", "device_peak", "compiled_autoplay"}
    if device.type != "cuda" or not args.shape:  # (a 135M model's prefill logits outweigh its weights)
        measures = [m for m in measures if m[0] != "device_peak"]
    unknown = chosen - {name for name, _ in measures}
    if unknown:
        parser.error(f"no such measure: {', '.join(sorted(unknown))}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        device.type,
        args.shape,
        results["date"],
        "quick" if args.quick else None,
        "only" if chosen and not args.shape else None,
    ]
    path = out / f"{'-'.join(p for p in parts if p)}.json"
    for name, run in measures:
        if chosen and name not in chosen:
            continue
        console.print(f"  measuring {name}…")
        results[name] = in_thread(run)
        path.write_text(json.dumps(results, indent=2))  # (so far: a run stopped part way keeps what it measured)
    results["budgets"] = verdicts(results)

    table = Table(title="tokenviz bench", header_style="bold")
    for col in ("measure", "value", "budget", "met"):
        table.add_column(col)
    for v in results["budgets"].values():
        if v["value"] is None:
            continue
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "—"}[v["met"]]
        table.add_row(v["label"], f"{v['value']:.3f}", v["budget"], met)
    Console().print(table)
    Console().print_json(json.dumps({k: v for k, v in results.items() if k not in ("budgets", "machine", "model")}))
    path.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
