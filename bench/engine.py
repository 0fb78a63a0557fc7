"""The engine's own figures: its step, prefill, autoplay, compiled step, memory, beside the bare runs."""

from __future__ import annotations

import gc
import json
import pickle
import statistics
import threading
import time

import psutil
import torch

from bench.anchors import PROMPT, StaticGenerate, bare_decoder, bare_steps, generate_seconds
from bench.shaped import weights_bytes
from bench.timing import in_thread, p95, paired_ratio, seconds_of, sync
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Play
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import HeadAblation, Intervention
from tokenviz.contract.settings import SamplingSettings
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
    engine, plain = zip(*pairs)
    e_ms, b_ms = (statistics.median(times) * 1000 for times in (engine, plain))
    e_p95, b_p95 = (p95(list(times)) * 1000 for times in (engine, plain))
    return {
        "engine_ms": e_ms,
        "bare_ms": b_ms,
        "ratio": paired_ratio(pairs),
        "engine_p95_ms": e_p95,
        "bare_p95_ms": b_p95,
        "p95_ratio": e_p95 / b_p95,
    }


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


def autoplay_seconds(
    loaded, tokens: int, prompt: str = PROMPT, settings: SamplingSettings = GREEDY
) -> tuple[float, list[int]]:
    """Headless autoplay through the engine thread, exactly as the app drives it: (seconds, the ids)."""
    snapshots, done = [], threading.Event()

    def post(snapshot):
        snapshots.append(snapshot)
        if snapshot.stop_reason and not snapshot.playing:
            done.set()

    worker = EngineWorker(lambda progress: loaded, settings.replace(max_new_tokens=tokens), prompt)
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


SEEDS_TRIED = 20  # seeds tried for a sampled journey that runs every token asked for


def full_length_seed(loaded, tokens: int, settings: SamplingSettings) -> SamplingSettings:
    """`settings` with the first seed whose journey runs all `tokens`: a draw of the end-of-text token
    ends a journey, while generate() is held to every token (min_new_tokens), and a journey cut short
    weighs a run's fixed costs (the play key, the last frame) on fewer tokens (26 of 64 with the
    default seed on the bundled model). Where none does, `settings` as they are."""
    for seed in range(SEEDS_TRIED):
        seeded = settings.replace(seed=seed)
        if len(autoplay_seconds(loaded, tokens, settings=seeded)[1]) == tokens:
            return seeded
    return settings


def autoplay_sampled(loaded, bare, device, tokens: int, rounds: int = 5) -> dict:
    """Autoplay with the app's default sampling settings against generate() sampling with the same
    settings (transformers' own processors and draw), as many tokens on each side (see
    full_length_seed), rounds interleaved and paired, tokens a second."""
    settings = full_length_seed(loaded, tokens, SamplingSettings())  # (and the warm-up)
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids.to(device)
    in_thread(lambda: generate_seconds(bare, ids, 4, device, sampled=settings))
    rates: list[tuple[float, float]] = []
    played: list[int] = []
    for _ in range(rounds):
        played_s, played = autoplay_seconds(loaded, tokens, settings=settings)
        generated_s, generated = in_thread(lambda: generate_seconds(bare, ids, tokens, device, sampled=settings))
        rates.append((len(played) / played_s, len(generated) / generated_s))
    return {
        "settings": {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p},
        "seed": settings.seed,
        "tokens": len(played),
        "autoplay_tok_s": statistics.median(a for a, _ in rates),
        "generate_tok_s": statistics.median(g for _, g in rates),
        "ratio": paired_ratio(rates),
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
                runner.beam_search(session.ids, width, steps, from_cache=False)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    short_s, long_s = seconds(short, True), seconds(long, True)
    return {
        f"{short}_s": short_s,
        f"{long}_s": long_s,
        f"{long}_fed_again_s": seconds(long, False),
        "ratio": long_s / short_s,
    }
