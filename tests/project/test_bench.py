"""The benchmark's code runs and reports every measure (on a tiny model; no time is asserted): each
ratio is the quotient of the figures it reports beside it, one round each here."""

import threading

import pytest
import torch
from tiny import save_tiny

from bench import anchors, app, budgets, engine, processes, timing
from tokenviz.backends.transformers.loading import load_model


@pytest.mark.compile  # (compiled_autoplay compiles the decode step: the slow group it belongs to)
def test_bench_measures_run_on_a_tiny_model(tmp_path):
    source = save_tiny(tmp_path / "tiny", "llama", context=2048)
    loaded = load_model(source, device="cpu")
    bare = anchors.bare_model(loaded, source, torch.device("cpu"))
    overhead = engine.step_overhead(loaded, bare, torch.device("cpu"), steps=3, rounds=1)
    assert timing.paired_ratio([(2.0, 1.0), (9.0, 3.0), (100.0, 1.0)]) == 3.0  # (a drifted round does not move it)
    assert overhead["engine_ms"] > 0 and overhead["bare_ms"] > 0 and overhead["ratio"] > 0
    # The anchor is the faster bare cache, and the ratio is the one over it.
    anchor, other = sorted(engine.BARE_CACHES, key=lambda cache: overhead[f"bare_{cache}_ms"])
    assert overhead["anchor"] == anchor and overhead["bare_ms"] == overhead[f"bare_{anchor}_ms"]
    assert overhead["ratio"] == overhead[f"ratio_over_{anchor}"] and overhead[f"ratio_over_{other}"] > 0
    assert overhead["engine_p95_ms"] >= overhead["engine_ms"] and overhead["bare_p95_ms"] >= overhead["bare_ms"]
    assert overhead["p95_ratio"] == pytest.approx(overhead["engine_p95_ms"] / overhead["bare_p95_ms"])
    assert timing.p95([float(i) for i in range(1, 101)]) == pytest.approx(95.05)
    # Both sides are timed from their first token: generate() after its prefill, autoplay after the
    # engine's; a token's seconds are the gaps between them (autoplay's from Play to its first token too).
    ids = loaded.tokenizer(anchors.PROMPT, return_tensors="pt").input_ids
    made = anchors.generate_seconds(bare, ids, 8, torch.device("cpu"))
    assert len(made.ids) == 8 and len(made.token_seconds) == 7
    assert sum(made.token_seconds) <= made.seconds and made.tok_s == 8 / made.seconds
    played = engine.autoplay_run(loaded, 8)
    assert played.ids == made.ids and len(played.token_seconds) == 8
    assert sum(played.token_seconds) == pytest.approx(played.seconds, rel=0.5)
    play = engine.autoplay(loaded, bare, torch.device("cpu"), tokens=8, rounds=1)
    # Each cache's generate() gives the same tokens; each ratio is its own quotient, `ratio` the faster's.
    assert play["dynamic_same_tokens"] and play["static_same_tokens"] and play["static_warm_s"] > 0
    for cache in engine.BARE_CACHES:
        quotient = play["autoplay_tok_s"] / play[f"{cache}_generate_tok_s"]
        assert play[f"ratio_over_{cache}"] == pytest.approx(quotient) and play[f"{cache}_token_p95_ms"] > 0
    anchor = max(engine.BARE_CACHES, key=lambda cache: play[f"{cache}_generate_tok_s"])
    assert play["anchor"] == anchor and play["ratio"] == play[f"ratio_over_{anchor}"]
    assert play["autoplay_token_p95_ms"] > 0
    drawn = engine.autoplay_sampled(loaded, bare, torch.device("cpu"), tokens=8, rounds=1)
    assert drawn["settings"] == {"temperature": 0.7, "top_k": 50, "top_p": 0.9}  # the app's defaults
    anchor = max(engine.BARE_CACHES, key=lambda cache: drawn[f"{cache}_generate_tok_s"])
    assert drawn["ratio"] == pytest.approx(drawn["autoplay_tok_s"] / drawn[f"{anchor}_generate_tok_s"])
    assert drawn["anchor"] == anchor and 0 <= drawn["seed"] < engine.SEEDS_TRIED and 0 < drawn["tokens"] <= 8
    growth = engine.growth(loaded, bare, torch.device("cpu"), lengths=(8, 64), steps=2, rounds=1)
    assert set(growth) == {"8", "64", "ratio", "bare_ratio", "ratio_over_bare"}
    # The model's own growth set apart: the engine's ratio to the bare step far over its ratio near.
    assert growth["ratio_over_bare"] == growth["64"]["step_ratio"] / growth["8"]["step_ratio"]
    assert all(growth[n]["prefill_ratio"] > 0 and growth[n]["step_ratio"] > 0 for n in ("8", "64"))
    far = growth["64"]
    assert far["bare_step_ms"] == min(far["bare_dynamic_ms"], far["bare_static_ms"])
    assert far["step_ratio"] == far[f"ratio_over_{far['anchor']}"]
    view = engine.attention_view(loaded, n=64, rounds=1)
    assert view["rows"] == 64 and view["newest_rows_ms"] > 0 and view["rows_fed_again_ms"] > 0
    peak = processes.peak_memory(n=64, source=source, beside_default_malloc=False)  # (two processes, not four)
    assert peak["model_run_peak_gb"] > 0 and peak["engine_run_peak_gb"] > 0
    frames = app.frame(loaded, sizes=((80, 24),), steps=3)
    assert frames["80x24_ms"] > 0
    ui = app.ui_growth(loaded, long=300, short=50, steps=3, rounds=1)
    assert ui["300_ms"] > 0 and ui["50_ms"] > 0 and ui["ratio"] == pytest.approx(ui["300_ms"] / ui["50_ms"])
    snapped = app.snapshot_growth(loaded, long=300, short=50, steps=3)
    assert snapped["ratio"] == pytest.approx(snapped["300_ms"] / snapped["50_ms"]) and snapped["whole_text_300_ms"] > 0
    assert snapped["over_whole_text"] == pytest.approx(snapped["300_ms"] / snapped["whole_text_300_ms"])
    shown = app.app_autoplay(loaded, context=100, tokens=4)
    assert shown["headless_tok_s"] > 0 and shown["app_tok_s"] > 0 and shown["ratio"] > 0
    memory = engine.memory(loaded, steps=20)
    assert memory["history_mb_per_1000"] > 0 and memory["step_record_kb_mean"] > 0
    assert 0 < memory["queries_kept_mb"] <= memory["queries_budget_mb"]
    searched = engine.beams(loaded, long=200, short=20, steps=3, rounds=1)
    assert searched["200_s"] > 0 and searched["200_fed_again_s"] > 0
    assert searched["ratio"] == pytest.approx(searched["200_s"] / searched["20_s"])
    keyed = app.key_frame(loaded, context=30, presses=2)
    assert keyed["median_ms"] > 0 and keyed["max_ms"] >= keyed["median_ms"]
    offloaded = processes.offload(source, steps=2)
    assert offloaded["parts_on_disk"] > 0 and offloaded["same_tokens"] and offloaded["ratio"] > 0
    refused = processes.refusal()
    # A Llama-3-70B-shaped config: one line (with the figures), and the process never grew past 1 GB.
    assert refused["refused"] and 0 < refused["peak_rss_gb"] < 1 and refused["seconds"] > 0
    assert "of weights in" in refused["error"] and "free" in refused["error"]
    constrained = engine.grammar_step(loaded, steps=3, rounds=1)
    assert constrained["grammar_ms"] > 0 and constrained["plain_ms"] > 0
    assert constrained["ratio"] == pytest.approx(constrained["grammar_ms"] / constrained["plain_ms"])
    intervened = engine.intervention_step(loaded, steps=3, rounds=1)
    assert intervened["intervened_ms"] > 0 and intervened["plain_ms"] > 0
    assert intervened["ratio"] == pytest.approx(intervened["intervened_ms"] / intervened["plain_ms"])
    long = processes.trace_long(loaded, source=source, n=64, rounds=1)
    assert long["traced_tokens"] == long["tokens"] >= 64  # (the same prompt on both sides)
    assert long["ratio"] == pytest.approx(long["trace_s"] / long["bare_s"])
    fast = engine.compiled_autoplay(loaded, bare, torch.device("cpu"), tokens=8, steps=3, rounds=1)
    assert fast["dynamic_same_tokens"] and fast["compile_s"] > 0 and fast["step_ratio"] > 0
    assert fast["ratio"] == fast["ratio_over_dynamic"] > 0  # (its budget: against eager generate())
    results = {
        "compiled_autoplay": fast,
        "trace_long": long,
        "intervention_step": intervened,
        "grammar_step": constrained,
        "step_overhead": overhead,
        "autoplay": play,
        "autoplay_sampled": drawn,
        "growth": growth,
        "attention_view": view,
        "peak_memory": peak,
        "frame": {"200x60_ms": 1.0},
        "cold_start": {
            "first_frame_s": 0.4,
            "ready_s": None,
            "bare_ready_s": anchors.bare_ready_s(source),
            "ratio": None,
        },
        "memory": memory,
        "beams": searched,
        "key_frame": keyed,
        "offload": offloaded,
        "refusal": refused,
    }
    results["growth"]["2048"] = results["growth"]["4096"] = growth["64"]  # the verdicts read these lengths
    verdicts = budgets.verdicts(results)
    assert set(verdicts) == set(budgets.BUDGETS)
    assert verdicts["cold_start_s"]["met"] is True and verdicts["model_ready"]["met"] is None
    assert results["cold_start"]["bare_ready_s"] > 0
    assert verdicts["frame_200x60_ms"]["met"] is True
    assert verdicts["offload_same"]["met"] is True and verdicts["refusal_gb"]["met"] is True
    # --compile's budget is a GPU's (CUDA graphs): shown on a CPU, not judged there.
    assert verdicts["compiled_autoplay"]["value"] == fast["ratio"] and verdicts["compiled_autoplay"]["met"] is None
    assert verdicts["compiled_over_static"]["value"] == fast["ratio_over_static"]
    assert verdicts["compiled_over_static"]["met"] is None
    on_gpu = {"ratio": 3.9, "ratio_over_static": 0.5}
    fast_on_gpu = budgets.verdicts({**results, "machine": {"gpu": "H200"}, "compiled_autoplay": on_gpu})
    assert fast_on_gpu["compiled_autoplay"]["met"] is True and fast_on_gpu["compiled_over_static"]["met"] is False


def test_the_lens_step_measure_reports_each_context_and_its_ratio(tiny_llama):
    lensed = engine.lens_step(tiny_llama, torch.device("cpu"), steps=2, lengths=(0, 40), rounds=1)
    assert lensed["lens_rows"] == len(anchors.lens_view_rows(tiny_llama.info.layers))
    prompt = len(tiny_llama.tokenizer(anchors.PROMPT)["input_ids"])
    assert set(lensed) == {"lens_rows", f"context_{prompt}", f"context_{prompt + 40}"}
    for at in (lensed[f"context_{prompt}"], lensed[f"context_{prompt + 40}"]):
        assert at["step_ms"] > 0 and at["ratio"] == pytest.approx(at["step_with_lens_ms"] / at["step_ms"])


def test_autoplay_is_judged_against_the_faster_eligible_generate_round_by_round():
    def runs(*seconds):
        return [anchors.Run(s, [1, 2, 3, 4], [s / 4] * 3) for s in seconds]

    played = runs(2.0, 4.0, 2.0)
    compared = engine.versus_anchors(played, {"dynamic": runs(2.0, 4.0, 2.0), "static": runs(1.0, 2.0, 1.0)})
    # The static cache's runs are the faster: the ratio is over them, each round's own (a slow round
    # on both sides is 1 / 2 like the rest).
    assert compared["anchor"] == "static" and compared["ratio"] == compared["ratio_over_static"] == 0.5
    assert compared["ratio_over_dynamic"] == 1.0 and compared["autoplay_tok_s"] == 2.0
    assert compared["static_token_p95_ms"] == pytest.approx(500.0)  # (a token of the slow round: 2 s / 4)
    # On a GPU, generate() compiles the static cache's forward: an eager autoplay is judged against the
    # default cache's generate() alone.
    eager_on_gpu = engine.versus_anchors(
        played,
        {"dynamic": runs(2.0, 4.0, 2.0), "static": runs(1.0, 2.0, 1.0)},
        engine.eager_anchors(torch.device("cuda")),
    )
    assert eager_on_gpu["anchor"] == "dynamic" and eager_on_gpu["ratio"] == 1.0
    assert engine.eager_anchors(torch.device("cpu")) == engine.BARE_CACHES


def test_a_measure_runs_in_a_thread_of_its_own_and_its_failure_reaches_the_caller():
    """(So the main thread never runs the model: see bench.timing.in_thread.)"""
    assert timing.in_thread(threading.current_thread) not in (threading.current_thread(), threading.main_thread())

    def failing() -> None:
        raise ValueError("the measure failed")

    with pytest.raises(ValueError, match="the measure failed"):
        timing.in_thread(failing)


def test_the_terminal_guards_measure_reports_its_quotients():
    """bench's terminal_guard: the watcher's start against the command line's import, its memory against a
    tokenviz process's before a model loads (system.terminal_guard), each ratio its own quotient."""
    guard = app.terminal_guard(rounds=1)
    assert guard["guard_ms"] > 0 and guard["import_ms"] > 0 and guard["watcher_mb"] > 0
    assert guard["ratio"] == pytest.approx(guard["guard_ms"] / guard["import_ms"])
    assert guard["memory_ratio"] == pytest.approx(guard["watcher_mb"] / guard["app_before_model_mb"])
