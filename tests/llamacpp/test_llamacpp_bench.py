"""The benchmark's llama.cpp measures run and report (one short round each; no time is asserted): each
ratio is the quotient of the figures beside it, autoplay makes llama-cpp-python's own greedy tokens, and
the budgets judge them."""

from __future__ import annotations

import pytest
from llama_reference import PROMPT

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
    scored = in_thread(lambda: llamacpp.score_against(rounds=1, window=64, characters=2000))
    assert scored["windows"] >= 2 and scored["ratio"] == pytest.approx(
        scored["score_against_s"] / scored["bare_passes_s"]
    )
    judged = budgets.verdicts({"llamacpp_step": step, "llamacpp_autoplay": played, "llamacpp_score_against": scored})
    assert judged["llamacpp_score_against"]["value"] == scored["ratio"]
    bundled_step = judged["llamacpp_step_bundled"]
    assert bundled_step["value"] == step["ratio"] and bundled_step["met"] in (True, False)
    assert judged["llamacpp_lens_step"]["value"] == step["lens_ratio"]
    assert judged["llamacpp_autoplay_bundled"]["value"] == played["ratio"]
    assert judged["llamacpp_step"]["value"] is None is judged["llamacpp_autoplay"]["value"]  # (a --gguf's budgets)


def test_a_shaped_gguf_is_made_once_and_the_measures_run_on_it(tmp_path):
    """`--gguf SHAPE`: the bundled tokenizer, its vocabulary padded with control tokens to the shape's, in
    a body of the shape's layers, quantized by llama.cpp and opened by tokenviz as any GGUF; made once,
    then taken as it is; the results file's model block is that GGUF's."""
    from bench.shaped_gguf import shaped_gguf
    from tokenviz.backends.llamacpp.runtime import Runtime
    from tokenviz.system.paths import bundled_gguf

    shape = dict(layers=2, hidden=128, ffn=256, heads=4, kv_heads=2, vocab=50_000)
    made = shaped_gguf(shape, tmp_path)
    assert made.name.endswith(".Q4_1.gguf") and sorted(p.name for p in tmp_path.iterdir()) == [made.name]
    runtime, bundled = Runtime(made, 256), Runtime(bundled_gguf(), 256)
    try:
        assert (runtime.shape.layers, runtime.shape.hidden, runtime.shape.heads) == (2, 128, 4)
        assert runtime.shape.kv_heads == 2 and runtime.shape.vocab == 50_000 > bundled.shape.vocab
        assert runtime.is_control(49_999) and not runtime.is_control(bundled.tokenize(PROMPT, False)[0])
        assert "Q4_1" in runtime.shape.description
        assert runtime.tokenize(PROMPT, True) == bundled.tokenize(PROMPT, True)  # (the bundled tokenizer)
    finally:
        runtime.close()
        bundled.close()
    made_at = made.stat().st_mtime_ns
    assert shaped_gguf(shape, tmp_path) == made and made.stat().st_mtime_ns == made_at
    step = in_thread(lambda: llamacpp.step(steps=2, rounds=1, gguf=made))
    assert step["step_ms"] > 0 and step["ratio"] > 0 and step["lens_rows"] > 0
    assert step["model"].startswith(made.name) and "Q4_1, 2 layers" in step["model"]
    assert step["lens_ratio"] == pytest.approx(step["step_with_lens_ms"] / step["step_ms"])
    played = in_thread(lambda: llamacpp.autoplay(tokens=4, rounds=1, gguf=made))
    assert played["same_tokens"] and played["ratio"] > 0
    judged = budgets.verdicts({"llamacpp_step": step, "llamacpp_autoplay": played})
    assert judged["llamacpp_step"]["value"] == step["ratio"] and judged["llamacpp_autoplay"]["value"] == played["ratio"]
    assert judged["llamacpp_step_bundled"]["value"] is None is judged["llamacpp_autoplay_bundled"]["value"]
    assert llamacpp.gguf_file(None) is None and llamacpp.gguf_file(str(made)) == made
    described = in_thread(lambda: llamacpp.gguf_described(str(made)))
    assert described["file"] == str(made) and described["vocab"] == 50_000 and described["layers"] == 2


def test_a_gguf_option_naming_nothing_is_one_line(capsys):
    from bench.measures import main

    with pytest.raises(SystemExit) as exited:
        main(["--gguf", "no-such.gguf", "--only", "llamacpp_step"])
    assert exited.value.code == 2 and "--gguf no-such.gguf: neither a file nor a shape (1B)" in capsys.readouterr().err


def test_gpu_layers_reach_both_sides_and_a_cpu_build_refuses_them_in_one_line(capsys):
    """`python -m bench --gpu-layers N` offloads N layers in tokenviz's engine and in llama-cpp-python's own
    `Llama` alike (the anchor runs where the engine does); a build for the CPU alone is one line, exit 2,
    before anything is measured; a negative count too."""
    import llama_cpp

    from bench.measures import arguments

    llm = in_thread(lambda: llamacpp.own_llama(gpu_layers=3))
    assert llm.model_params.n_gpu_layers == 3
    with pytest.raises(SystemExit) as exited:
        arguments(["--gpu-layers", "-1"])
    assert exited.value.code == 2 and "--gpu-layers -1: give a whole number from 0" in capsys.readouterr().err
    if llama_cpp.llama_supports_gpu_offload():
        assert arguments(["--gpu-layers", "99"])[1].gpu_layers == 99
        engine = in_thread(lambda: llamacpp.open_engine(gpu_layers=99))
        assert engine.info.device == "gpu (llama.cpp: every layer and the head)"
        return
    with pytest.raises(SystemExit) as exited:
        arguments(["--gpu-layers", "99"])
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2 and "--gpu-layers 99: this llama-cpp-python was built for the CPU alone" in said
