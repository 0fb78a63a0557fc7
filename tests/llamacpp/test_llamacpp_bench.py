"""The benchmark's llama.cpp measures run and report (one short round each; no time is asserted): each
ratio is the quotient of the figures beside it, autoplay makes llama-cpp-python's own greedy tokens, and
the budgets judge them."""

from __future__ import annotations

import pytest

from bench import budgets, llamacpp
from bench.timing import in_thread

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]


def test_the_llama_cpp_measures_run_and_are_judged():
    step = in_thread(lambda: llamacpp.step(steps=3, rounds=1))
    assert step["step_ms"] > 0 and step["bare_decode_ms"] > 0 and step["ratio"] > 0
    assert step["lens_ratio"] == pytest.approx(step["step_with_lens_ms"] / step["step_ms"])
    played = in_thread(lambda: llamacpp.autoplay(tokens=8, rounds=1))
    assert played["same_tokens"]  # (autoplay's greedy tokens are llama-cpp-python's own)
    assert played["ratio"] == pytest.approx(played["autoplay_tok_s"] / played["own_generate_tok_s"])
    judged = budgets.verdicts({"llamacpp_step": step, "llamacpp_autoplay": played})
    assert judged["llamacpp_step"]["value"] == step["ratio"] and judged["llamacpp_step"]["met"] in (True, False)
    assert judged["llamacpp_lens_step"]["value"] == step["lens_ratio"]
    assert judged["llamacpp_autoplay"]["value"] == played["ratio"]
