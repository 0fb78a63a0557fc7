"""Figures of whole processes: peak memory, a refused model, the GGUF conversion, a model on the disk,
trace of a long prompt."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.anchors import BARE_TRACE, PROMPT
from bench.shaped import weights_bytes
from bench.timing import paired_ratio
from tokenviz.backends.transformers.gguf_cache import convert_gguf, gguf_cache_dir
from tokenviz.backends.transformers.loading import load_model
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.system.paths import bundled_gguf

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
    print(session.engine.rows.queries.nbytes, session.engine.rows.queries.budget)
else:  # as generate() prefills: sdpa, the cache, the last position's logits
    loaded.model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        loaded.model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
print(rss("VmHWM:") - before)
"""


def peak_memory(n: int = 4096, source: str | None = None, beside_default_malloc: bool = True) -> dict:
    """How far RSS rises above the loaded model while a fresh process prefills `n` tokens through
    the engine (and makes every prompt position's prediction), against one that prefills them as
    generate() does (CPU, Linux). The query states the attention view keeps are counted in the
    engine's peak and reported apart, with their budget.

    Both processes run with glibc's mmap threshold fixed, so a freed large tensor goes back to the
    system and the peak is what the process held: with the threshold glibc moves by itself, freed
    memory stays in the heap, and identical runs of either process peaked up to 0.15 GB apart. The
    same measure under glibc's default is reported beside it (`beside_default_malloc`: two processes more)."""
    peaks, queries = {}, []
    fixed = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    for malloc, env in (("", fixed), ("default_malloc_", None))[: 2 if beside_default_malloc else 1]:
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
        "default_malloc_extra_gb": (
            peaks["default_malloc_engine"] - peaks["default_malloc_model"] if beside_default_malloc else None
        ),
        "queries_kept_gb": queries[0] / 2**30,
        "queries_budget_gb": queries[1] / 2**30,
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
