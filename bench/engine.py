"""The engine's own figures: its step, prefill, autoplay, compiled step, memory, beside the bare runs."""

from __future__ import annotations

import functools
import gc
import itertools
import json
import pickle
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from bench.anchors import (
    PROMPT,
    Run,
    StaticGenerate,
    bare_decoder,
    bare_steps,
    generate_seconds,
    lens_view_rows,
    step_with_lens,
)
from bench.shaped import weights_bytes
from bench.timing import in_thread, p95, paired_ratio, seconds_of, sync
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Play
from tokenviz.contract.engine import SearchAsk
from tokenviz.contract.features import LABELLED
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import HeadAblation, Intervention
from tokenviz.contract.settings import SamplingSettings
from tokenviz.features.sparse_autoencoder import SparseAutoencoder
from tokenviz.journey.feature_readings import features_at, labels_for
from tokenviz.journey.session import Session
from tokenviz.worker.engine_thread import EngineWorker

VIEW_ROWS = 114  # query rows the attention pane shows at 200x60
GREEDY = SamplingSettings(temperature=0)


def transformers_runner(session: Session) -> ModelRunner:
    """The session's engine as the transformers backend it is here (the bench reads its query store)."""
    assert isinstance(session.engine, ModelRunner)
    return session.engine


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


def engine_steps(
    loaded: LoadedModel,
    ids: list[int],
    steps: int,
    grammar: Grammar | None = None,
    interventions: tuple[Intervention, ...] = (),
) -> tuple[float, list[float]]:
    """(prefill seconds, per-step seconds) of the engine, greedy (see started_session)."""
    session, prefill = started_session(loaded, ids, grammar, interventions)
    device = session.engine.device
    return prefill, [seconds_of(session.step, device) for _ in range(steps)]


BARE_CACHES = ("dynamic", "static")  # the bare step's caches: the faster is each length's anchor


@torch.inference_mode()
def steps_in_turn(loaded: LoadedModel, bare, ids: list[int], steps: int, device: torch.device) -> dict:
    """The engine's greedy decode steps and the bare model's with each of BARE_CACHES (argmax, nothing
    else: see bare_decoder), taken in turn from the same prompt, the order turning each step: seconds
    of each (the first 2 left out as warm-up) by name, and the engine's prefill. Steps a step apart see
    the same machine: rounds of many steps each had this 2-core machine's pace drift between them (a
    bare step at 2,048 tokens 67 ms in one run and 72 ms, the same as at 32, in the next)."""
    session, prefill = started_session(loaded, ids)
    runs = {"engine": session.step} | {
        cache: bare_decoder(bare, ids, device, cache, room=steps + 8) for cache in BARE_CACHES
    }
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(steps + 2):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(seconds_of(runs[name], device))
    return {"seconds": {name: times[2:] for name, times in seconds.items()}, "prefill": prefill}


def versus_bare_steps(seconds: dict[str, list[float]]) -> dict:
    """The engine's steps against the bare ones (see steps_in_turn): each side's median and p95 in ms,
    and the ratios (the median of each turn's engine / bare) over the faster bare cache by median, the
    anchor; its ratio over the other beside."""
    engine = seconds["engine"]
    bare = {cache: seconds[cache] for cache in BARE_CACHES}
    anchor = min(bare, key=lambda cache: statistics.median(bare[cache]))
    engine_p95, bare_p95 = p95(engine) * 1000, p95(bare[anchor]) * 1000
    out: dict = {
        "engine_ms": statistics.median(engine) * 1000,
        "bare_ms": statistics.median(bare[anchor]) * 1000,
        "anchor": anchor,
        "ratio": paired_ratio(list(zip(engine, bare[anchor]))),
        "engine_p95_ms": engine_p95,
        "bare_p95_ms": bare_p95,
        "p95_ratio": engine_p95 / bare_p95,
    }
    for cache, times in bare.items():
        out[f"bare_{cache}_ms"] = statistics.median(times) * 1000
        out[f"ratio_over_{cache}"] = paired_ratio(list(zip(engine, times)))
    return out


def step_overhead(loaded, bare, device, steps: int, rounds: int = 5) -> dict:
    """The engine's step against the bare step, short context: steps in turn (see steps_in_turn and
    versus_bare_steps)."""
    ids = loaded.tokenizer(PROMPT)["input_ids"]
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, times in steps_in_turn(loaded, bare, ids, steps, device)["seconds"].items():
            seconds.setdefault(name, []).extend(times)
    return versus_bare_steps(seconds)


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


def lens_step(loaded, device, steps: int, lengths: tuple[int, ...] = (0, 1000), rounds: int = 2) -> dict:
    """A step with the lens view open at 80x24 (the step, then the lens at the step just taken for the rows
    that view shows) against a plain step, after the prompt and after `lengths` tokens more of context:
    the step's own pass reads the lens's rows, so it costs the head over the rows shown at any length."""
    rows = lens_view_rows(loaded.info.layers)
    out: dict = {"lens_rows": len(rows)}
    for length in lengths:
        ids = loaded.tokenizer(PROMPT)["input_ids"] + random_ids(loaded, length)
        plain, lensed = [], []
        for _ in range(rounds):
            session, _ = started_session(loaded, ids)
            plain += [seconds_of(session.step, device) for _ in range(steps + 2)][2:]
            with_lens = functools.partial(step_with_lens, started_session(loaded, ids)[0], rows)
            lensed += [seconds_of(with_lens, device) for _ in range(steps + 2)][2:]
        p, w = statistics.median(plain) * 1000, statistics.median(lensed) * 1000
        out[f"context_{len(ids)}"] = {"step_ms": p, "step_with_lens_ms": w, "ratio": w / p}
    return out


SAE_FEATURES, SAE_K = 2048, 32  # as `tokenviz sae-train` makes one by default


def bench_sae(loaded: LoadedModel) -> SparseAutoencoder:
    """A TopK SAE of sae-train's default shape at two thirds of the model's depth, random weights (its cost
    is its shape's: an encode of one residual, and the labels of the features new at a step)."""
    hidden, g = loaded.info.hidden, torch.Generator().manual_seed(0)
    w_enc = torch.randn(hidden, SAE_FEATURES, generator=g) / hidden**0.5
    return SparseAutoencoder(
        "bench", "SAELens", "topk", (2 * loaded.info.layers) // 3, w_enc, torch.zeros(SAE_FEATURES),
        w_enc.T.contiguous(), torch.zeros(hidden), k=SAE_K,
    )  # fmt: skip


def sae_step(loaded, device, steps: int, rounds: int = 3) -> dict:
    """A step with the features view open (the step, then every SAE loaded read at the step just taken: what
    its frame waits for) against a plain step; a step with the SAE loaded and the view closed; and, apart,
    the labels of the features the view shows, asked after that frame (`labels_ms`: a pass over the head
    for those not labelled before). Rounds interleaved, each round's ratio its own (paired_ratio)."""
    ids = loaded.tokenizer(PROMPT)["input_ids"]
    sae = bench_sae(loaded)
    open_pairs, closed_pairs = [], []
    for _ in range(rounds):
        session, _ = started_session(loaded, ids)
        plain = statistics.median([seconds_of(session.step, device) for _ in range(steps + 2)][2:])
        session, _ = started_session(loaded, ids)
        session.saes = (sae,)
        closed = statistics.median([seconds_of(session.step, device) for _ in range(steps + 2)][2:])

        def step_read(session: Session = session) -> None:
            session.step()
            features_at(session, len(session.ids) - 1)

        viewed = statistics.median([seconds_of(step_read, device) for _ in range(steps + 2)][2:])
        open_pairs.append((viewed, plain))
        closed_pairs.append((closed, plain))
    fresh, _ = started_session(loaded, ids)
    fresh.saes = (sae,)
    shown = [("bench", f) for f in range(LABELLED)]
    labels_ms = seconds_of(lambda: labels_for(fresh, shown), device) * 1000  # none cached yet: one pass over the head
    return {
        "sae": {"features": SAE_FEATURES, "k": SAE_K, "layer": sae.layer},
        "ratio": paired_ratio(open_pairs),
        "closed_ratio": paired_ratio(closed_pairs),
        "plain_step_ms": statistics.median(p for _, p in open_pairs) * 1000,
        "labels_ms": labels_ms,
    }


def autoplay_run(
    loaded,
    tokens: int,
    prompt: str = PROMPT,
    settings: SamplingSettings = GREEDY,
    engine: Callable[[], Any] | None = None,
) -> Run:
    """Headless autoplay through the engine thread, exactly as the app drives it, timed from Play (the
    journey prefilled, its first token decided) to its last token: see Run. A token's seconds are its
    frame's share (a step slower than a frame, as on a CPU, publishes each). The engine is `loaded` on
    the transformers backend, or what `engine()` opens."""
    snapshots, frames, done = [], [], threading.Event()

    def post(snapshot):
        snapshots.append(snapshot)
        frames.append((time.perf_counter(), len(snapshot.chips)))
        if snapshot.stop_reason and not snapshot.playing:
            done.set()

    opened = engine or (lambda: ModelRunner(loaded))
    worker = EngineWorker(lambda progress: opened(), settings.replace(max_new_tokens=tokens), prompt)
    worker.start(post)
    while not snapshots or snapshots[-1].state not in ("ready", "error"):  # loaded and prefilled
        time.sleep(0.01)
    started, before = time.perf_counter(), len(frames)
    worker.submit(Play(on=True))
    done.wait()
    seconds = time.perf_counter() - started
    worker.stop()
    last = snapshots[-1]
    shares, points = [], [(started, frames[before - 1][1]), *frames[before:]]
    for (t0, n0), (t1, n1) in itertools.pairwise(points):
        shares += [(t1 - t0) / (n1 - n0)] * (n1 - n0) if n1 > n0 else []
    return Run(seconds, [c.id for c in last.chips[last.prompt_len :]], shares)


def versus_anchors(played: list[Run], anchors: dict[str, list[Run]], eligible: tuple[str, ...] = BARE_CACHES) -> dict:
    """Autoplay's rounds against each bare anchor's, paired round by round: tokens a second of each,
    the ratio over each, whether each made autoplay's tokens, a token's p95 on each side; `ratio` is
    over the faster `eligible` anchor by median (`anchor`), the run a user wanting speed would make."""
    out: dict = {"autoplay_tok_s": statistics.median(run.tok_s for run in played)}
    out["autoplay_token_p95_ms"] = p95([t for run in played for t in run.token_seconds]) * 1000
    for name, runs in anchors.items():
        out[f"{name}_generate_tok_s"] = statistics.median(run.tok_s for run in runs)
        out[f"ratio_over_{name}"] = paired_ratio([(a.tok_s, g.tok_s) for a, g in zip(played, runs)])
        out[f"{name}_same_tokens"] = played[-1].ids == runs[-1].ids
        out[f"{name}_token_p95_ms"] = p95([t for run in runs for t in run.token_seconds]) * 1000
    anchor = max(eligible, key=lambda name: out[f"{name}_generate_tok_s"])
    return {"anchor": anchor, "ratio": out[f"ratio_over_{anchor}"], **out}


def against_generate(loaded, bare, device, tokens: int, rounds: int, settings: SamplingSettings = GREEDY) -> dict:
    """Headless autoplay with `settings` against generate() with the same ones (greedy, or drawn by
    transformers' own processors and draw) and the default cache and the static cache (see
    generate_seconds), rounds interleaved and paired, each in a thread of its own (see in_thread);
    `ratio` over the faster (see versus_anchors), on a GPU over the eager one (the static cache's is
    compiled there: `--compile`'s anchor, see compiled_autoplay)."""
    sampled = None if settings.greedy else settings
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids.to(device)
    in_thread(lambda: generate_seconds(bare, ids, 4, device, sampled=sampled))  # (warm-up)
    static_generate = StaticGenerate(bare, ids, tokens, device, sampled=sampled)
    played, dynamic, static = [], [], []
    for _ in range(rounds):
        played.append(autoplay_run(loaded, tokens, settings=settings))
        dynamic.append(in_thread(lambda: generate_seconds(bare, ids, tokens, device, sampled=sampled)))
        static.append(static_generate())
    static_generate.close()
    compared = versus_anchors(played, {"dynamic": dynamic, "static": static}, eager_anchors(device))
    return {**compared, "tokens": len(played[-1].ids), "static_warm_s": static_generate.warm_s}


def autoplay(loaded, bare, device, tokens: int, rounds: int = 5) -> dict:
    """Greedy autoplay against generate() of the same tokens (see against_generate)."""
    autoplay_run(loaded, 8)  # warm-up
    return against_generate(loaded, bare, device, tokens, rounds)


def eager_anchors(device: torch.device) -> tuple[str, ...]:
    """The generate() runs an eager autoplay is judged against: on a GPU generate() compiles the static
    cache's forward, which only `--compile` is set against."""
    return ("dynamic",) if device.type == "cuda" else BARE_CACHES


SEEDS_TRIED = 20  # seeds tried for a sampled journey that runs every token asked for


def full_length_seed(loaded, tokens: int, settings: SamplingSettings) -> SamplingSettings:
    """`settings` with the first seed whose journey runs all `tokens`: a draw of the end-of-text token
    ends a journey, while generate() is held to every token (min_new_tokens), and a journey cut short
    weighs a run's fixed costs (the play key, the last frame) on fewer tokens (26 of 64 with the
    default seed on the bundled model). Where none does, `settings` as they are."""
    for seed in range(SEEDS_TRIED):
        seeded = settings.replace(seed=seed)
        if len(autoplay_run(loaded, tokens, settings=seeded).ids) == tokens:
            return seeded
    return settings


def autoplay_sampled(loaded, bare, device, tokens: int, rounds: int = 5) -> dict:
    """Autoplay with the app's default sampling settings against generate() sampling with the same
    settings (transformers' own processors and draw), with the default and the static cache, as many
    tokens on each side (see full_length_seed), rounds interleaved and paired (see versus_anchors).
    The draws differ (each its own generator): tokens a second, not the tokens, are compared."""
    settings = full_length_seed(loaded, tokens, SamplingSettings())  # (and the warm-up)
    compared = against_generate(loaded, bare, device, tokens, rounds, settings)
    return {
        "settings": {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p},
        "seed": settings.seed,
        **{k: v for k, v in compared.items() if not k.endswith("same_tokens")},
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
        "ratio": played["ratio_over_dynamic"],  # (the budget: against eager generate(); the static one beside it)
        "step_ms": c,
        "eager_step_ms": e,
        "bare_step_ms": b,
        "step_ratio": c / b,
    }


def random_ids(loaded: LoadedModel, n: int) -> list[int]:
    return torch.randint(0, loaded.info.vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@torch.inference_mode()
def growth(loaded, bare, device, lengths=(32, 512, 2048, 4096), steps: int = 12, rounds: int = 3) -> dict:
    """Per length of context: the engine's decode step against the faster bare sdpa step (see
    steps_in_turn and versus_bare_steps), and the engine's prefill against one bare forward pass of the
    same prompt that makes the last position's logits, as generate() prefills (the fastest of the
    rounds). How the step grows from 32 to 2048 tokens of context is set against how the bare step
    grows (the model's own attention over more keys): the engine's ratio to the bare step at 2048 over
    its ratio at 32, which is `ratio` over `bare_ratio` measured a step apart."""
    out: dict = {}
    for n in lengths:
        ids = random_ids(loaded, n)
        seconds: dict[str, list[float]] = {}
        prefills, forwards = [], []
        for _ in range(rounds):
            turn = steps_in_turn(loaded, bare, ids, steps, device)
            for name, times in turn["seconds"].items():
                seconds.setdefault(name, []).extend(times)
            prefills.append(turn["prefill"])
            sync(device)
            started = time.perf_counter()
            bare(torch.tensor([ids], device=device), logits_to_keep=1)  # (as generate() prefills)
            sync(device)
            forwards.append(time.perf_counter() - started)
        steps_here = versus_bare_steps(seconds)
        out[str(n)] = {
            "step_ms": steps_here["engine_ms"],
            "bare_step_ms": steps_here["bare_ms"],
            "step_ratio": steps_here["ratio"],
            **{k: v for k, v in steps_here.items() if k not in ("engine_ms", "bare_ms", "ratio")},  # (named above)
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
                transformers_runner(session).rows.queries.drop_from(0)
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
        "queries_kept_mb": transformers_runner(session).rows.queries.nbytes / 2**20,
    }


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
    kept = transformers_runner(session).rows.queries.nbytes  # the query states kept for the view: bounded, not per step
    half = len(sizes) // 2
    kv = session.engine.kv_bytes
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
        "queries_budget_mb": transformers_runner(session).rows.queries.budget / 2**20,
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
    weights, kv = weights_bytes(loaded.model), session.engine.kv_bytes
    queries = transformers_runner(session).rows.queries.nbytes
    return {
        "peak_gb": peak / 1e9,
        "weights_gb": weights / 1e9,
        "kv_cache_gb": kv / 1e9,
        "queries_kept_gb": queries / 1e9,
        "ratio": peak / (weights + kv),
        "ratio_with_queries_kept": peak / (weights + kv + queries),  # the attention view's own budget
    }


def beams(loaded, long: int = 2000, short: int = 50, width: int = 3, steps: int = 10, rounds: int = 3) -> dict:
    """B, the beam search the app runs (from the journey's KV cache), at a `long` context against a
    `short` one; and, as the before figure, the same search fed the whole long context again."""
    from tokenviz.contract.commands import Beams
    from tokenviz.journey.views import compute

    def seconds(n: int, from_cache: bool) -> float:
        runner = ModelRunner(loaded)
        session = Session(runner, SamplingSettings(temperature=0))
        session.start(random_ids(loaded, n))
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            if from_cache:  # as the app's B computes it: through the view's spec
                compute(session, Beams(width, steps))
            else:
                runner.beam_search(SearchAsk(tuple(session.ids), steps), width)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    short_s, long_s = seconds(short, True), seconds(long, True)
    return {
        f"{short}_s": short_s,
        f"{long}_s": long_s,
        f"{long}_fed_again_s": seconds(long, False),
        "ratio": long_s / short_s,
    }
