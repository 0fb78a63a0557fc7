"""The bare runs each figure is set against: transformers' own model, generate() with its default
and its static cache, a bare process that loads and runs the same model."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from bench.timing import in_thread, seconds_of, sync
from tokenviz.backends.transformers.gguf_cache import gguf_cache_dir
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.contract.lens_layers import spread
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.system.paths import bundled_gguf

PROMPT = "The Eiffel Tower is located in"
LENS_VIEW_ROOM = 5  # the lens rows the lens view of an 80x24 terminal shows (tests/ui/test_lens_rows.py)


def lens_view_rows(layers: int) -> tuple[int, ...]:
    """The lens rows that view asks for on a model of `layers` layers (spread over its depth)."""
    return spread(range(layers + 1), LENS_VIEW_ROOM)


def step_with_lens(session: Session, rows: tuple[int, ...] | None) -> None:
    """A step with the lens view open: the step, then the lens at the step just taken for `rows` (None:
    every row), as the lens view asks it."""
    session.step()
    session.analyses.inspect(len(session.ids) - 2, rows)


def bare_model(loaded: LoadedModel, source: str, device: torch.device):
    """The same weights with transformers' default fast attention (sdpa), no attention outputs."""
    from transformers import AutoModelForCausalLM

    from tokenviz.backends.transformers.quiet import quiet

    with quiet():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=loaded.model.dtype, attn_implementation="sdpa")
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers wraps .to


@torch.inference_mode()
def bare_decoder(
    model, ids: list[int], device: torch.device, cache: str = "dynamic", room: int = 0
) -> Callable[[], None]:
    """The bare model's greedy decode after prefilling `ids`, with argmax and nothing else, and
    transformers' default cache ("dynamic", which copies each layer's keys to grow them) or its static
    cache ("static", `room` steps past the prompt, over which each step attends masked): each call is
    one step."""
    from transformers import DynamicCache, StaticCache

    from tokenviz.backends.transformers.cache import with_cache

    kept = (
        StaticCache(config=model.config, max_cache_len=len(ids) + room)
        if cache == "static"
        else DynamicCache(config=model.config)
    )
    out = model(torch.tensor([ids], device=device), **with_cache(model, kept), use_cache=True, logits_to_keep=1)
    token = out.logits[0, -1].argmax().view(1, 1)

    @torch.inference_mode()
    def step() -> None:
        nonlocal token
        out = model(token, **with_cache(model, kept), use_cache=True)
        token = out.logits[0, -1].argmax().view(1, 1)

    return step


def bare_steps(model, ids: list[int], steps: int, device: torch.device) -> list[float]:
    """Per-step seconds of the bare model's greedy decode (see bare_decoder)."""
    step = bare_decoder(model, ids, device)
    return [seconds_of(step, device) for _ in range(steps)]


@dataclass(frozen=True)
class Run:
    """One run of tokens, timed from its first token to its last: generate() after its prefill and
    first decision, autoplay after the engine's (a journey starts prefilled, its first token decided),
    so each side's seconds hold the same forwards and decisions (127 of each for 128 tokens)."""

    seconds: float
    ids: list[int]
    token_seconds: list[float]  # each token's own: one forward and one decision

    @property
    def tok_s(self) -> float:
        return len(self.ids) / self.seconds


class TokenTimes:
    """generate()'s stopping criterion that stops nothing: the time each token is made (the first
    waits for the device: its prefill done)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []
        self.go_on: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if not self.times:
            sync(self.device)
        self.times.append(time.perf_counter())
        if self.go_on is None:
            self.go_on = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return self.go_on


def generate_seconds(
    bare, ids, tokens: int, device, cache: str = "dynamic", sampled: SamplingSettings | None = None
) -> Run:
    """generate() of `tokens` tokens, timed as Run says: greedy, or drawn with `sampled`'s temperature,
    top-k and top-p; with transformers' default cache ("dynamic") or its static cache ("static"),
    whose forward generate() compiles on a GPU (CUDA graphs, transformers' own fastest path) and runs
    eager on a CPU."""
    from transformers import StoppingCriteriaList

    static = {"cache_implementation": "static"} if cache == "static" else {}
    drawing: dict = {"do_sample": False}
    if sampled is not None:
        drawing = dict(do_sample=True, temperature=sampled.temperature, top_k=sampled.top_k, top_p=sampled.top_p)
    stamps = TokenTimes(device)
    with torch.inference_mode():
        out = bare.generate(
            ids,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            stopping_criteria=StoppingCriteriaList([stamps]),
            **drawing,
            **static,
        )
        sync(device)
    ended = time.perf_counter()
    gaps = [b - a for a, b in itertools.pairwise(stamps.times)]
    return Run(ended - stamps.times[0], out[0, ids.shape[1] :].tolist(), gaps)


class StaticGenerate:
    """generate() with the static cache (drawn with `sampled`, if given). On a GPU each run goes to one
    thread kept for it: torch keeps the CUDA graphs it records per thread (graph trees), so a fresh
    thread each run would record them again. On a CPU each run has a fresh thread, as every other
    measure (see in_thread): a thread kept alive keeps its OpenMP workers, and beside them the other
    measures' workers outnumber the cores and sleep between regions (autoplay measured 4% slower than
    the static cache's generate() while that thread lived, the same as it once the thread was gone).
    Made warm: `warm_s` is its first two runs, the compile and the recording on a GPU (once per length
    and process), which the rounds after do not pay."""

    def __init__(self, bare, ids, tokens: int, device, sampled: SamplingSettings | None = None) -> None:
        from tokenviz.backends.transformers.compiled_step import graph_trees_in_this_thread

        self.run = lambda: generate_seconds(bare, ids, tokens, device, "static", sampled)
        self.pool = ThreadPoolExecutor(1, "bench-static", graph_trees_in_this_thread) if device.type == "cuda" else None
        started = time.perf_counter()
        self()
        self()
        self.warm_s = time.perf_counter() - started

    def __call__(self) -> Run:
        return in_thread(self.run) if self.pool is None else self.pool.submit(self.run).result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


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
