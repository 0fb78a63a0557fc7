"""A GGUF in llama.cpp (--backend llama.cpp), measured against llama.cpp's own bare runs on the same file in
the same process, through llama-cpp-python's own `Llama` (never tokenviz's wrapper): a step against
Llama.eval of one token with its logits read, autoplay against llama-cpp-python's own greedy generation, a
step with the lens open against one without; and its step against the transformers backend's on the same
GGUF (dequantized), a figure for the docs."""

from __future__ import annotations

import functools
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.anchors import PROMPT, lens_view_rows, step_with_lens
from bench.engine import autoplay_run, started_session
from bench.shaped_gguf import GGUF_SHAPES, shaped_gguf
from bench.timing import in_thread, paired_ratio, seconds_of
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.record_json import as_json
from tokenviz.journey.session import Session

CPU = torch.device("cpu")  # (llama.cpp's logits are read into the host's memory: nothing to wait for)


def open_engine(gguf: Path | None = None, gpu_layers: int = 0):
    """The GGUF `gguf` (the bundled one by default) on the llama.cpp backend, as `--backend llama.cpp` opens it
    (with `--gpu-layers gpu_layers` where not 0)."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening

    options = {"gpu_layers": gpu_layers} if gpu_layers else {}
    opening = Opening("trace", options, frozenset(), None if gguf is None else str(gguf), SamplingSettings())
    return BACKEND.loader(opening)(lambda message, fraction: None)


def bare_decoder(gguf: Path | None, ids: list[int], gpu_layers: int = 0) -> Callable[[], None]:
    """llama.cpp bare, through llama-cpp-python's own `Llama` (never tokenviz's runtime): each call evaluates
    one token (the argmax of the last logits, which Llama.eval copies out) and nothing else."""
    llm = own_llama(gguf, gpu_layers=gpu_layers)
    llm.eval(ids)
    state = {"token": int(np.argmax(llm.scores[llm.n_tokens - 1]))}

    def step() -> None:
        llm.eval([state["token"]])
        state["token"] = int(np.argmax(llm.scores[llm.n_tokens - 1]))

    return step


def greedy_session(engine, ids: list[int]) -> Session:
    session = Session(engine, SamplingSettings(temperature=0, max_new_tokens=10**6))
    session.start(ids, defer_predictions=True)
    return session


def steps_in_turn(runs: dict[str, Callable[[], object]], steps: int) -> dict[str, list[float]]:
    """Each run's seconds per call, the runs taken in turn (the order turning each step), the first 2 left out."""
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(steps + 2):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(seconds_of(runs[name], CPU))
    return {name: times[2:] for name, times in seconds.items()}


def step(steps: int, rounds: int = 3, gguf: Path | None = None, gpu_layers: int = 0) -> dict:
    """The engine's greedy step (the journey's decode, decision and record) against a bare llama_decode of
    one token with its logits read, in turn; and a step with the lens view open at 80x24 (the step, then the
    lens at its position for the rows that view shows) against the plain step, and with every row."""
    engine = open_engine(gguf, gpu_layers)
    ids = engine.encode(PROMPT)
    shown = lens_view_rows(engine.info.layers)
    plain: list[float] = []
    bare: list[float] = []
    lensed: list[float] = []
    every: list[float] = []
    for _ in range(rounds):
        session = greedy_session(engine, ids)
        seconds = steps_in_turn({"engine": session.step, "bare": bare_decoder(gguf, ids, gpu_layers)}, steps)
        plain += seconds["engine"]
        bare += seconds["bare"]
        for rows, into in ((shown, lensed), (None, every)):
            with_lens = functools.partial(step_with_lens, greedy_session(engine.twin(), ids), rows)
            into += steps_in_turn({"lens": with_lens}, steps)["lens"]
    step_ms, bare_ms, lens_ms, every_ms = (statistics.median(x) * 1e3 for x in (plain, bare, lensed, every))
    return {
        "model": f"{engine.path.name}: {engine.runtime.shape.description}, {engine.info.layers} layers",
        "bundled": gguf is None,  # (its budgets: see bench.budgets)
        "gpu_layers": gpu_layers,
        "step_ms": step_ms,
        "bare_decode_ms": bare_ms,
        "ratio": paired_ratio(list(zip(plain, bare))),
        "lens_rows": len(shown),
        "step_with_lens_ms": lens_ms,
        "lens_ratio": lens_ms / step_ms,
        "step_with_every_row_ms": every_ms,
        "every_row_ratio": every_ms / step_ms,
    }


def own_llama(gguf: Path | None = None, flash_attn: bool = True, logits_all: bool = False, gpu_layers: int = 0) -> Any:
    """llama-cpp-python's own `Llama` on `gguf` (the bundled GGUF by default), as tokenviz runs the file: its
    threads, flash attention as llama.cpp's CPU default (llama-cpp-python's is off), no extra buffer types
    where AMX is (llama.cpp's AMX kernel crashes on Q4_1: see runtime.amx_present), `gpu_layers` offloaded
    as tokenviz's --gpu-layers offloads them; `logits_all` keeps every position's logits (the tests'
    reference reads them)."""
    import llama_cpp

    from tokenviz.backends.llamacpp.runtime import amx_present, default_threads
    from tokenviz.system.paths import bundled_gguf

    bindings = llama_cpp.llama_cpp
    default = bindings.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = not amx_present()
        return p

    bindings.llama_model_default_params = params
    try:
        threads = default_threads()  # (tokenviz's: llama-cpp-python's default is half the cores)
        return llama_cpp.Llama(
            model_path=str(gguf or bundled_gguf()),
            n_ctx=4096,
            n_gpu_layers=gpu_layers,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash_attn,
            logits_all=logits_all,
            verbose=False,
        )
    finally:
        bindings.llama_model_default_params = default


def own_generation(tokens: int, gguf: Path | None = None, gpu_layers: int = 0) -> tuple[float, list[int]]:
    """llama-cpp-python's own greedy generation of `tokens` tokens after the prompt on `gguf` (the bundled
    GGUF by default): (seconds from the prompt evaluated to the last token, the tokens)."""
    llm = own_llama(gguf, gpu_layers=gpu_layers)
    prompt = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    made: list[int] = []
    started = None
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if started is None:  # (the prompt's pass and the first token: autoplay starts after both)
            started = time.perf_counter()
        else:
            made.append(token)
        if len(made) == tokens:
            break
    assert started is not None
    return time.perf_counter() - started, made


def autoplay(tokens: int, rounds: int = 3, gguf: Path | None = None, gpu_layers: int = 0) -> dict:
    """Autoplay through the engine thread, as the app drives it, against llama-cpp-python's own greedy
    generation of as many tokens, rounds paired."""
    pairs, same = [], []
    for _ in range(rounds):
        run = autoplay_run(None, tokens, engine=functools.partial(open_engine, gguf, gpu_layers))
        n = len(run.ids) - 1  # (the first token is decided before Play)
        seconds, made = in_thread(functools.partial(own_generation, n, gguf, gpu_layers))
        pairs.append((run.tok_s, n / seconds))
        same.append(made == run.ids[1 : n + 1])
    return {
        "bundled": gguf is None,
        "gpu_layers": gpu_layers,
        "autoplay_tok_s": statistics.median(a for a, _ in pairs),
        "own_generate_tok_s": statistics.median(b for _, b in pairs),
        "ratio": paired_ratio(pairs),
        "same_tokens": all(same),
    }


def versus_transformers(loaded, steps: int) -> dict:
    """The bundled model's greedy step in llama.cpp (Q4_1) against the transformers backend's (the same
    GGUF dequantized, `loaded`), in turn: how much faster the quantized model runs here."""
    engine = open_engine()
    ours = greedy_session(engine, engine.encode(PROMPT))
    theirs, _ = started_session(loaded, loaded.tokenizer(PROMPT)["input_ids"])
    seconds = steps_in_turn({"llama.cpp": ours.step, "transformers": theirs.step}, steps)
    llama_ms, transformers_ms = (statistics.median(seconds[name]) * 1e3 for name in ("llama.cpp", "transformers"))
    return {
        "llama_cpp_step_ms": llama_ms,
        "transformers_step_ms": transformers_ms,
        "transformers_over_llama_cpp": paired_ratio(list(zip(seconds["transformers"], seconds["llama.cpp"]))),
    }


SCORED_TEXT = Path(__file__).parents[1] / "README.md"  # a text of this checkout long enough for its windows
SCORE_WINDOW = 512  # llama-perplexity's default


def bare_scoring(llms: list[Any], windows: list[list[int]]) -> None:
    """llama.cpp bare, through llama-cpp-python's own `Llama` (every position's logits kept): each window
    fed alone to each model in one pass, as llama-perplexity feeds it, its logits read."""
    for window in windows:
        for llm in llms:
            llm.reset()
            llm.eval(window)
            np.asarray(llm.scores[: len(window)])


def score_against(
    rounds: int = 3,
    gguf: Path | None = None,
    window: int = SCORE_WINDOW,
    characters: int | None = None,
    gpu_layers: int = 0,
) -> dict:
    """`score --against-model` (the GGUF against itself: the same work as against another of its shape)
    against the two models' bare teacher-forced passes over the same windows, rounds paired (on the text's
    first `characters`, or all of it)."""
    from tokenviz.journey.against_base import score_against_base, windows

    q, base = open_engine(gguf, gpu_layers), open_engine(gguf, gpu_layers)
    text = SCORED_TEXT.read_text()[:characters]
    ids = base.encode(text)
    cut = windows(ids, window, None)
    llms = [own_llama(gguf, logits_all=True, gpu_layers=gpu_layers) for _ in range(2)]
    pairs = []
    for _ in range(rounds):
        ours = seconds_of(lambda: score_against_base(q, base, text, window), CPU)
        bare = seconds_of(lambda: bare_scoring(llms, cut), CPU)
        pairs.append((ours, bare))
    return {
        "windows": len(cut),
        "window": window,
        "score_against_s": statistics.median(a for a, _ in pairs),
        "bare_passes_s": statistics.median(b for _, b in pairs),
        "ratio": paired_ratio(pairs),
    }


def gguf_file(choice: str | None) -> Path | None:
    """`--gguf`: a shape's name (bench.shaped_gguf, made once into the user cache), or a file; None: the
    bundled GGUF."""
    if choice is None:
        return None
    if choice in GGUF_SHAPES:
        from tokenviz.system.paths import cache_root

        return shaped_gguf(GGUF_SHAPES[choice], cache_root() / "bench-gguf")
    return Path(choice)


def gguf_described(gguf: str | None, gpu_layers: int = 0) -> dict:
    """The GGUF `gguf` names (see gguf_file; None: the bundled one) as its engine describes it, where its
    layers run among them: the results file's model block."""
    engine = open_engine(gguf_file(gguf), gpu_layers)
    return {"file": str(engine.path), **as_json(engine.info)}


def gpu_layers_refused(gpu_layers: int) -> str | None:
    """Why `--gpu-layers` cannot be taken here (None: it can): a negative count, no llama-cpp-python, or one
    built for the CPU alone (where llama.cpp would run every layer on the CPU, unsaid)."""
    if gpu_layers < 0:
        return "give a whole number from 0"
    if not gpu_layers:
        return None
    if importlib.util.find_spec("llama_cpp") is None:
        return "the llama.cpp measures need llama-cpp-python (pip install 'tokenviz[llamacpp]')"
    from tokenviz.backends.llamacpp.runtime import offload_refused

    return offload_refused(gpu_layers)


def llamacpp_measures(
    loaded, steps: int, tokens: int, gguf: str | None = None, gpu_layers: int = 0
) -> list[tuple[str, Callable[[], dict]]]:
    """The measures above by name, where llama-cpp-python is installed (the llamacpp extra), on the GGUF
    `gguf` names (see gguf_file), `gpu_layers` of its layers offloaded on both sides; the step against the
    transformers backend's where `loaded` is the bundled model there (not a random-weight shape), so is the
    GGUF, and all of it runs on the CPU."""
    if importlib.util.find_spec("llama_cpp") is None:
        return []
    file = functools.cache(lambda: gguf_file(gguf))  # (a shape is made when a measure first needs it)
    measures = [
        ("llamacpp_step", lambda: step(steps, gguf=file(), gpu_layers=gpu_layers)),
        ("llamacpp_autoplay", lambda: autoplay(tokens, gguf=file(), gpu_layers=gpu_layers)),
        ("llamacpp_score_against", lambda: score_against(gguf=file(), gpu_layers=gpu_layers)),
    ]
    if loaded is not None and gguf is None and not gpu_layers:
        measures.append(("llamacpp_vs_transformers", lambda: versus_transformers(loaded, steps)))
    return measures
