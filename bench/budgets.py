"""Each figure's budget, and whether a run met it (a GPU's budgets judged on a GPU alone)."""

from __future__ import annotations

BUDGETS = {
    "step_overhead": ("engine step / the faster bare sdpa step (default or static cache), short context", "<=", 1.03),
    "step_2048": ("engine step / the faster bare sdpa step (default or static cache), 2048 context", "<=", 1.05),
    "prefill_2048": ("engine prefill / bare sdpa forward (last logits, as generate()), 2048 tokens", "<=", 1.15),
    "prefill_4096": ("engine prefill / bare sdpa forward (last logits, as generate()), 4096 tokens", "<=", 1.15),
    "peak_4096_gb": ("peak RSS over the bare model's prefill (last logits only), 4096 tokens, GB", "<=", 0.25),
    "attention_2048_ms": ("attention view of one layer, 2048 context, ms", "<=", 50.0),
    "step_p95": ("engine step p95 / the faster bare step's p95, short context", "<=", 1.15),
    "autoplay_sampled": ("autoplay tok/s / the faster generate() tok/s, the app's default sampling", ">=", 1.0),
    "autoplay": ("autoplay tok/s / the faster generate() tok/s (default or static cache), greedy", ">=", 1.0),
    "growth": ("step at 2048 / step at 32, over the bare step's own 2048 / 32", "<=", 1.05),
    "frame_200x60_ms": ("pane update at 200x60, ms", "<=", 16.0),
    "ui_growth": ("pane update, 6000-token journey / 50-token journey", "<=", 1.2),
    "snapshot_6000": ("the engine's snapshot of a step / its two texts decoded whole (before), 6000 tokens", "<=", 0.5),
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
    "served_lens_step": (
        "a served step, lens view open at 80x24 / one without (--endpoint, vllm-lens)",
        "<=",
        1.5,
    ),
    "sae_step": ("a step with the features view open (one SAE, 2048 features, k 32) / a plain step", "<=", 1.2),
    "sae_step_closed": ("a step with an SAE loaded and the features view closed / a plain step", "<=", 1.03),
    "llamacpp_step": (
        "a step in llama.cpp / a bare llama_decode of one token, its logits read, on --gguf's file or shape",
        "<=",
        1.05,
    ),
    "llamacpp_autoplay": (
        "autoplay in llama.cpp tok/s / llama-cpp-python's own greedy generation, on --gguf's file or shape",
        ">=",
        0.95,
    ),
    "llamacpp_step_bundled": (
        "the same step ratio, on the bundled GGUF (135M: a vocabulary row is more of a step)",
        "<=",
        1.10,
    ),
    "llamacpp_autoplay_bundled": ("the same autoplay ratio, on the bundled GGUF", ">=", 0.90),
    "llamacpp_lens_step": ("a step in llama.cpp with the lens view open at 80x24 / one without", "<=", 1.5),
    "llamacpp_score_against": (
        "score --against-model / the two models' bare teacher-forced passes over its windows (llama.cpp)",
        "<=",
        1.2,
    ),
}


# What only a GPU has (CUDA graphs): shown on a CPU, not judged there (a CPU's step is its matmuls).
GPU_BUDGETS = frozenset({"compiled_autoplay", "compiled_over_static"})


def _on_gguf(measure: dict | None, key: str, bundled: bool) -> float | None:
    """A llama.cpp measure's figure where it was taken on the bundled GGUF (`bundled`) or on another (a
    shape of `--gguf`, judged by the issue's budgets for real shapes)."""
    return measure[key] if measure is not None and bool(measure.get("bundled")) == bundled else None


def verdicts(r: dict) -> dict:
    growth, view = r.get("growth", {}), r.get("attention_view")
    values = {
        "step_overhead": r.get("step_overhead", {}).get("ratio"),
        "step_2048": growth.get("2048", {}).get("step_ratio"),
        "prefill_2048": growth.get("2048", {}).get("prefill_ratio"),
        "prefill_4096": growth.get("4096", {}).get("prefill_ratio"),
        "peak_4096_gb": r.get("peak_memory", {}).get("extra_gb"),
        "attention_2048_ms": max(view["newest_rows_ms"], view["another_layer_ms"]) if view else None,
        "step_p95": r.get("step_overhead", {}).get("p95_ratio"),
        "autoplay_sampled": r.get("autoplay_sampled", {}).get("ratio"),
        "autoplay": r.get("autoplay", {}).get("ratio"),
        "growth": growth.get("ratio_over_bare"),
        "frame_200x60_ms": r.get("frame", {}).get("200x60_ms"),
        "ui_growth": r.get("ui_growth", {}).get("ratio"),
        "snapshot_6000": r.get("snapshot_growth", {}).get("over_whole_text"),
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
        "sae_step": r.get("sae_step", {}).get("ratio"),
        "sae_step_closed": r.get("sae_step", {}).get("closed_ratio"),
        "llamacpp_step": _on_gguf(r.get("llamacpp_step"), "ratio", bundled=False),
        "llamacpp_autoplay": _on_gguf(r.get("llamacpp_autoplay"), "ratio", bundled=False),
        "llamacpp_step_bundled": _on_gguf(r.get("llamacpp_step"), "ratio", bundled=True),
        "llamacpp_autoplay_bundled": _on_gguf(r.get("llamacpp_autoplay"), "ratio", bundled=True),
        "llamacpp_lens_step": r.get("llamacpp_step", {}).get("lens_ratio"),
        "llamacpp_score_against": r.get("llamacpp_score_against", {}).get("ratio"),
    }
    out = {}
    on_gpu = bool(r.get("machine", {}).get("gpu"))
    for key, (label, op, limit) in BUDGETS.items():
        value = values[key]
        judged = value is not None and (on_gpu or key not in GPU_BUDGETS)
        ok = (value <= limit if op == "<=" else value >= limit) if judged else None
        out[key] = {"label": label, "value": value, "budget": f"{op} {limit}", "met": ok}
    return out
