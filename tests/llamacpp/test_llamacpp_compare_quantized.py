"""`compare` of two GGUFs, a quantization against its base: per step the KL, Δp and top-1s as
llama-perplexity defines them (B the base, A's tokens the text), each equal to a computation on
llama-cpp-python's own `Llama` fed the journey's passes outside tokenviz; the journey's statistics in
llama-perplexity's terms; and in a real terminal at 80x24, the chart, ▲ where the top-1s differ and the
key that moves the cursor to each.

The files: the bundled model (Q4_1) as B, the base, and itself requantized to Q4_K_M by llama.cpp's own
quantizer as A, a real model whose top-1s part within a few greedy steps."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from clitools import invoke
from llama_reference import PROMPT, offloaded_args, own_llama, requantized

from tokenviz.system.paths import bundled_gguf

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

STEPS = 16
# A story, so that Q4_K_M's greedy path runs all 16 steps: after the shared prompt's "located in" it ends
# at step 5 where llama.cpp runs without its extra buffer types (a CPU with AMX: runtime.amx_present).
STORY = "Once upon a time, in a small village by the sea,"
# B's log-probabilities are kept in 16 bits over its top 16 nats, as llama-perplexity keeps its base's:
# a step's figures are within this of the float64 ones.
NATS = 1e-3


@pytest.fixture(scope="module")
def quantized(llama_cpp, tmp_path_factory):
    return requantized(bundled_gguf(), tmp_path_factory.mktemp("compare") / "smollm2-Q4_K_M.gguf", "Q4_K_M")


def compared(monkeypatch, capsys, quantized) -> dict:
    args = ["compare", STORY, "--backend", "llama.cpp", "--model", str(quantized), "--against-model"]
    more = [str(bundled_gguf()), *offloaded_args(), "--steps", str(STEPS), "-t", "0", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args, *more)
    assert code == 0, err
    return json.loads(out)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


def test_each_step_is_llama_perplexitys_figures_on_llama_cpps_own_logits(monkeypatch, capsys, quantized):
    """Each step's nll, KLD(B ‖ A), Δp and top-1s equal those of llama-cpp-python's own Llama on each file fed
    A's path in the journey's passes (the prompt at once, then a token a pass: B too, after the paths part,
    as a journey of B on A's path would feed them); the statistics are theirs over the journey."""
    doc = compared(monkeypatch, capsys, quantized)
    prompt = [t["id"] for t in doc["a"]["prompt"]]
    chosen = [s["chosen"]["id"] for s in doc["a"]["steps"]]
    assert len(doc["diff"]) == len(chosen) == STEPS
    rows = []
    for path in (quantized, bundled_gguf()):
        llama = next(own_llama(path=path))
        llama.eval(prompt)
        scores = [np.asarray(llama.scores[len(prompt) - 1], dtype=np.float32)]
        for token in chosen[:-1]:
            llama.eval([token])
            scores.append(np.asarray(llama.scores[llama.n_tokens - 1], dtype=np.float32))
        rows.append([log_softmax(s) for s in scores])
    differ = []
    for d, token, la, lb in zip(doc["diff"], chosen, *rows):
        kept = lb > -16.0
        kld = float((np.exp(lb) * (lb - la))[kept].sum())
        assert (d["nll_a"], d["nll_b"], d["kld"]) == pytest.approx((-la[token], -lb[token], kld), abs=NATS), d
        assert d["dp"] == pytest.approx(math.exp(la[token]) - math.exp(lb[token]), abs=1e-4)
        assert (d["a_top"], d["b_top"]) == (int(la.argmax()), int(lb.argmax())) and d["top1_agree"] == (
            d["a_top"] == d["b_top"]
        )
        differ.append(not d["top1_agree"])
    assert any(differ), "Q4_K_M's top-1 never parted from the base's: the file tests nothing here"
    statistics = doc["statistics"]
    assert statistics["count"] == STEPS and statistics["same_top_p"] == pytest.approx(1 - sum(differ) / STEPS)
    assert statistics["mean_kld"] == pytest.approx(np.mean([d["kld"] for d in doc["diff"]]), abs=1e-9)
    ratio = math.exp(np.mean([d["nll_a"] - d["nll_b"] for d in doc["diff"]]))
    assert statistics["ppl_ratio"] == pytest.approx(ratio, rel=1e-6)


@pytest.mark.terminal
def test_the_app_charts_the_kl_marks_each_parting_and_p_jumps_to_them_at_80x24(monkeypatch, capsys, quantized):
    """At 80x24: the line of statistics is the headless document's; ▲ under the chart where the top-1s
    differ; p puts the cursor on each such step in turn (its row the table's last), P back."""
    from terminals import keys, quits_cleanly, screen, terminal, wait_screen, wait_toast

    doc = compared(monkeypatch, capsys, quantized)
    s = doc["statistics"]
    parts = [d["index"] for d in doc["diff"] if not d["top1_agree"]]
    args = ["compare", STORY, "--backend", "llama.cpp", "--model", str(quantized), "--against-model"]
    more = [str(bundled_gguf()), *offloaded_args(), "--steps", str(STEPS), "-t", "0"]
    with terminal((80, 24), *args, *more) as name:
        wait_screen(name, r"A: ", timeout=120)
        keys(name, "a")  # autoplay: both step to the end
        text = wait_screen(name, rf"{STEPS} of {STEPS} steps, B the base", timeout=240)
        line = " ".join(line for line in text.splitlines() if "B the base" in line or "same top" in line)
        assert f"mean KLD {s['mean_kld']:.4f} nats" in line and f"same top {s['same_top_p']:.1%}" in line, line
        marks = next(line for line in text.splitlines() if "top-1s differ" in line)
        assert marks.count("▲") == len(parts), (marks, parts)
        for part in parts:
            keys(name, "p")
            last = wait_screen(name, rf"│\s*{part}[ †] .* differ ", timeout=30)
            rows = [line for line in last.splitlines() if re.match(r"│\s*\d+[ †] ", line)]
            assert re.match(rf"│\s*{part}[ †] ", rows[-1]), rows
        keys(name, "p")
        wait_toast(name, f"the top-1s do not differ after step {parts[-1]}", timeout=30)
        if len(parts) > 1:
            keys(name, "P")
            wait_screen(name, rf"│\s*{parts[-2]}[ †] .* differ ", timeout=30)
        quits_cleanly(name)
        assert "Traceback" not in screen(name)


@pytest.mark.bundled
@pytest.mark.terminal
def test_compare_against_llama_cpp_names_each_runtime_charts_the_raw_kl_and_home_goes_back_at_120x36():
    """UX 7's findings 14 and 13: each header names its runtime where they differ (transformers never appeared),
    both as tall, so the two sides' panes begin on one row;
    greedy, the chart is of the models' own distributions (the final ones' KL is 0 or ∞: it was empty); Home
    puts the cursor on the first step, so the rows show it, and End back on the newest."""
    from terminals import keys, quits_cleanly, screen, terminal, wait_screen

    args = ["compare", PROMPT, "--against-backend", "llama.cpp", *offloaded_args(), "--steps", "8", "-t", "0"]
    with terminal((120, 36), *args) as name:
        wait_screen(name, r"B: ", timeout=180)
        keys(name, "a")
        text = wait_screen(name, r"8 of 8 steps, B the base", timeout=240)
        flat = re.sub(r"\s+", " ", text)
        assert "≠ runtime transformers" in flat and "≠ runtime llama.cpp" in flat, text
        top = next(line for line in text.splitlines() if "╭─ tokens" in line)  # (finding 13: B's taller header
        assert top.count("╭─ tokens") == 2, text  # pushed its panes a row below A's)
        chart = next(line for line in text.splitlines() if "KL raw, bits" in line)
        assert re.search(r"KL raw, bits\s+[▁▂▃▄▅▆▇█]{8}", chart), chart
        rows = lambda shown: [line for line in shown.splitlines() if re.match(r"│\s*\d+[ †] ", line)]  # noqa: E731
        assert re.match(r"│\s*7[ †] ", rows(text)[-1]), rows(text)
        keys(name, "Home")
        shown = wait_screen(name, r"│\s*0[ †] .*\n(?!│\s*1[ †] )", timeout=30)
        assert len(rows(shown)) == 1, rows(shown)
        keys(name, "End")
        wait_screen(name, r"│\s*7[ †] ", timeout=30)
        quits_cleanly(name)
        assert "Traceback" not in screen(name)
