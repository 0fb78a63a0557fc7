"""`score --against-model`: what a quantization changes, in llama-perplexity's terms, equal to
llama-perplexity's own output (built from the llama.cpp sources of the pinned llama-cpp-python) on the same
files, text and window; each window as one batch, as llama-perplexity feeds it with -b as large as -c.

The files: the bundled model (Q4_1) as the base and itself requantized to Q4_K_M by llama.cpp's own
quantizer (a real model, so the tails are real); and a zoo family whose tokenizer adds a BOS (gemma2:
each window begins with it) in F16 against its Q4_K_M."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from browser import chromium, needs_browser, until
from clitools import invoke
from gguf_zoo import zoo_gguf
from llama_perplexity import kl_divergence, printed
from llama_reference import requantized
from selenium.webdriver.common.by import By

from tokenviz.system.paths import bundled_gguf

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

WINDOW = 128
# One unit in llama-perplexity's last printed place; for a figure as large as a random model's perplexity
# (about 50,000, printed to 6 decimals) a millionth of it: each token's float32 log-sum-exp can round
# another way when its double sum is added in another order (llama-perplexity's threads take tokens as
# they come).
RELATIVE = 1e-6

TEXT = """\
The harbour town woke slowly. Fishing boats came in before the light, their engines low, and the gulls
followed them as they always had, crying over the nets. By seven the bakery on the corner had its doors
open and the smell of bread reached the water. Old men sat on the wall by the slipway and argued about
the weather, which they agreed was worse than it used to be, though none of them could say when it had
been better.

In the school above the town a teacher wrote a sum on the board and asked who could explain it. A girl
at the back said that you could not add apples and pears, but you could add fruit, and the class laughed,
and the teacher said that she was right, and that most of mathematics was deciding what counted as the
same thing. Then she drew a line and marked it in tenths, and asked where a third would fall.

At noon the ferry left for the island with eleven passengers, a van of building supplies and a crate of
hens. The crossing took forty minutes. The captain had made it twice a day for nineteen years and still
looked at the sky before he cast off. On the island the post office was also the shop and the library,
and the woman who ran it knew every parcel before it was opened.

In the evening the wind turned to the west and the rain came in sideways off the sea. People hurried
home with their collars up. The lights of the pub were warm against the wet street, and someone inside
was playing the piano badly but with great feeling. Later the rain stopped, the clouds broke, and for a
while the stars were out over the harbour, very bright and very far away, as if nothing below them had
happened at all.
"""


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "harbour.txt"
    path.write_text(TEXT * 2)  # long enough for four windows of 128 on every tokenizer here
    return path


@pytest.fixture(scope="module")
def files(llama_cpp, tmp_path_factory):
    """(base, quantized) pairs: the bundled model and its Q4_K_M; gemma2's F16 and Q4_K_M."""
    folder = tmp_path_factory.mktemp("against")
    return {
        "bundled": (bundled_gguf(), requantized(bundled_gguf(), folder / "smollm2-Q4_K_M.gguf", "Q4_K_M")),
        "gemma2": (zoo_gguf("gemma2", "F16"), zoo_gguf("gemma2", "Q4_K_M")),
    }


def score_against(monkeypatch, capsys, quantized, base, text_file, *more, window=WINDOW, spelled="--window"):
    code, out, err = invoke(
        monkeypatch,
        capsys,
        "score",
        str(text_file),
        "--backend",
        "llama.cpp",
        "--model",
        str(quantized),
        "--against-model",
        str(base),
        spelled,
        str(window),
        *more,
    )
    assert code == 0, err
    return out


@pytest.mark.parametrize("pair", ["bundled", "gemma2"])
def test_scoring_against_a_base_gives_llama_perplexitys_own_statistics(
    monkeypatch, capsys, llama_perplexity, files, text_file, tmp_path, pair
):
    base, quantized = files[pair]
    spelled = "--context" if pair == "gemma2" else "--window"  # (llama.cpp's --context is llama-perplexity's -c)
    doc = json.loads(score_against(monkeypatch, capsys, quantized, base, text_file, "--json", spelled=spelled))
    theirs = printed(kl_divergence(llama_perplexity, base, quantized, text_file, WINDOW, tmp_path / "base.kld"))
    ours = doc["statistics"]
    assert doc["window"] == WINDOW and doc["windows"] >= 4 and ours["count"] == doc["windows"] * (WINDOW // 2 - 1)
    for name, (value, decimals) in theirs.items():
        allowed = max(10.0**-decimals, RELATIVE * abs(value))
        assert ours[name] == pytest.approx(value, abs=allowed), (name, ours[name], value)
    if pair == "bundled":  # a real model: the quantization moves something, as llama.cpp measures it
        assert 0 < ours["mean_kld"] < 1 and 0 < ours["same_top_p"] < 1 and ours["rms_dp"] > 0
    tails = doc["tails"]
    by_kld = [t["kld"] for t in tails["by_kld"]]
    assert len(by_kld) == 10 and by_kld == sorted(by_kld, reverse=True)
    assert by_kld[0] == pytest.approx(ours["max_kld"], rel=1e-6)
    assert max(abs(t["dp"]) for t in tails["by_dp"]) == pytest.approx(max(ours["max_dp"], -ours["min_dp"]), rel=1e-6)
    assert tails["changed_top_count"] == round((1 - ours["same_top_p"]) * ours["count"])
    for t in tails["changed_top"]:
        assert t["top"][0]["id"] != t["base_top"][0]["id"] and len(t["top"]) == 5
    if pair == "bundled":
        lenses_end_on_the_scores(tails)


# The lens is read from what the scoring pass itself kept: its last row is the scored logits themselves, its
# probabilities a float32 softmax (2e-5 from float64's over this vocabulary, where the tails' top 5 sum in
# float64), the base's top kept in 16 bits (llama-perplexity's). (Read from a pass of its own, with logits at
# the tails alone, a probability moved by up to 0.0018 on the bundled Q4_1.)
SAME_PASS = {"top": 1e-4, "base_top": 1e-3}


def lenses_end_on_the_scores(tails):
    """Each tail's two lenses end on its side's own scored distribution (the scoring pass's own), and where
    they part is where their top-1s differ from then to the last layer."""
    lensed = [*tails["by_kld"], *tails["by_dp"], *tails["changed_top"][:10]]
    assert all(t["lens"] is not None for t in lensed)
    for t in lensed:
        lens = t["lens"]
        for side, within in SAME_PASS.items():
            last, final = lens[side][-1], t[side]
            assert last["prob"] == pytest.approx(final[0]["prob"], abs=within), (t["index"], side)
            if final[0]["prob"] - final[1]["prob"] > 2 * within:
                assert last["id"] == final[0]["id"], (t["index"], side)
        differ = [a["id"] != b["id"] for a, b in zip(lens["top"], lens["base_top"])]
        if lens["parted_from"] is None:
            assert not differ[-1]
        else:
            k = [row["layer"] for row in lens["top"]].index(lens["parted_from"])
            assert all(differ[k:]) and (k == 0 or not differ[k - 1])
            assert lens["parts_at"] is not None and lens["parts_at"] <= lens["parted_from"]


@needs_browser
def test_the_table_is_llama_perplexitys_layout_and_the_page_colours_the_text_by_kld(
    monkeypatch, capsys, files, text_file, tmp_path
):
    base, quantized = files["bundled"]
    page = tmp_path / "against.html"
    out = score_against(monkeypatch, capsys, quantized, base, text_file, "--html", str(page), window=256)
    for line in ("====== Perplexity statistics ======", "====== KL divergence statistics ======", "Same top p:"):
        assert line in out
    assert "windows of 256 tokens" in out and "KL(base || Q)" in out
    assert "where they differ most, by KLD" in out and "the top-1s differ at" in out
    code, _, err = invoke(
        monkeypatch, capsys, "score", str(text_file), "--backend", "llama.cpp", "--model", str(quantized),
        "--against-model", str(base), "--html", str(page),
    )  # fmt: skip
    assert code == 2 and "exists already" in err  # nothing the user made is lost
    with chromium() as browser:
        browser.get(page.resolve().as_uri())
        spans = until(lambda: browser.find_elements(By.CSS_SELECTOR, "#text span[data-kld]"), timeout=60)
        klds = [float(span.get_attribute("data-kld")) for span in spans]
        assert len(klds) == 2 * (256 // 2 - 1)  # every scored token of the two windows, coloured
        strongest = spans[klds.index(max(klds))]
        assert strongest.value_of_css_property("background-color") in ("rgb(214, 40, 40)", "rgba(214, 40, 40, 1)")
        rows = browser.find_elements(By.CSS_SELECTOR, "#tails tr")
        assert len(rows) == 10 and rows[0].find_element(By.TAG_NAME, "td").text == strongest.get_attribute("data-index")
        text = "".join(s.text for s in browser.find_elements(By.CSS_SELECTOR, "#text span"))
        assert text.replace("\n", "").replace(" ", "") in TEXT.replace("\n", "").replace(" ", "") * 2
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_a_base_in_transformers_is_the_gguf_dequantized_scored_in_one_pass(monkeypatch, capsys, text_file):
    """--against-backend transformers: the base is the same GGUF dequantized into transformers; each window's
    numbers are transformers' own pass over it and llama-cpp-python's own Llama's (outside tokenviz)."""
    from llama_reference import own_llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenviz.decoding.perplexity_statistics import BaseLogProbs, Tally, compare_token

    gguf = bundled_gguf()
    out = score_against(monkeypatch, capsys, gguf, gguf, text_file, "--against-backend", "transformers", "--json")
    doc = json.loads(out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    ids = tokenizer(text_file.read_text())["input_ids"]
    tally, first = Tally(), WINDOW // 2
    for reference in own_llama():
        for start in range(0, len(ids) - WINDOW + 1, WINDOW):
            window = ids[start : start + WINDOW]
            import torch

            with torch.inference_mode():
                base_rows = model(torch.tensor([window])).logits[0].float().numpy()
            reference.reset()
            reference.eval(window)
            rows = np.asarray(reference.scores[: len(window)], dtype=np.float32)
            for p in range(first, WINDOW - 1):
                tally.add(compare_token(rows[p], BaseLogProbs.of(base_rows[p]), window[p + 1]))
    expected = tally.statistics()
    assert doc["statistics"]["count"] == expected["count"]
    # llama.cpp's own Llama asks every position's logits, tokenviz those of the scored half: llama.cpp then
    # computes its last layer over another number of rows (a sum's order), and transformers on the other side
    # is the same pass.
    for name in ("mean_kld", "same_top_p", "rms_dp", "ln_ppl_ratio"):
        assert doc["statistics"][name] == pytest.approx(expected[name], rel=1e-3, abs=1e-5), name
    assert math.isfinite(doc["statistics"]["mean_kld"]) and doc["statistics"]["mean_kld"] > 0


def test_what_cannot_be_scored_against_a_base_is_one_line(monkeypatch, capsys, files, text_file, tmp_path):
    base, quantized = files["bundled"]
    args = ("score", "--backend", "llama.cpp", "--model", str(quantized))
    latin = tmp_path / "latin-1.txt"
    latin.write_bytes("café \x1b[31m".encode("latin-1") * 100)
    cases = {
        (str(latin), "--against-model", str(base)): "is not UTF-8 text",
        ("a short text", "--against-model", str(base)): "needs at least 1,024",
        (str(text_file), "--window", "64"): "go with a base to score against",
        (str(text_file), "--against-model", str(files["gemma2"][0]), "--window", "64"): "vocabularies differ",
        (str(text_file), "--against-model", str(base), "--window", "2"): "at least 4 tokens",
        (str(text_file), "--against-model", str(base), "--chat"): "no grammar and no --chat",
        (str(text_file), "--against-model", str(base), "--context", "2"): "at least 4 tokens, got 2",  # (the window)
        (
            "word " * 100 + "x" * 300,
            "--against-model",
            str(base),
        ): "needs at least 1,024",  # (past a file name's length)
    }
    for more, said in cases.items():
        code, out, err = invoke(monkeypatch, capsys, *args, *more)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and said in errors[0], (more, err)
        assert "Traceback" not in err and not out
