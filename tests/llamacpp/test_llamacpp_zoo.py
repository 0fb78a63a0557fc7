"""Every family × quantization of the GGUF zoo (gguf_zoo.py: tiny models converted and quantized by
llama.cpp's own tools) held to llama-cpp-python's own `Llama`, run outside tokenviz step by step as a
journey runs (the prompt in one batch, then a token a decode): the greedy tokens and each step's logits
bit for bit, and at every step the lens's last layer is the step's own distribution."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from clitools import invoke
from filelock import FileLock
from gguf_zoo import FAMILIES, QUANTS, zoo_gguf
from llama_reference import (
    PROMPT,
    engine_on,
    head_rows,
    own_llama,
    same_logits_as,
    softmax_of_queries_and_keys,
    trace,
)

pytestmark = [pytest.mark.llamacpp, pytest.mark.families, pytest.mark.usefixtures("llama_cpp")]

STEPS = 6
# The lens's last row and the step are softmaxes of the same pass's logits (float32; the order of a sum
# may differ): the bound is 1e-3, measured 0.
SAME_DISTRIBUTION = 1e-6


@pytest.mark.parametrize("kind", QUANTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_step_and_its_lens_are_llama_cpps_own(monkeypatch, capsys, family, kind):
    model = zoo_gguf(family, kind)
    doc = trace(monkeypatch, capsys, "--steps", str(STEPS), "--temperature", "0", "--lens", model=model)
    assert len(doc["steps"]) == STEPS, doc["stop_reason"]
    for reference in own_llama(path=model):
        same_logits_as(reference, doc)
        assert [s["chosen"]["id"] for s in doc["steps"]] == [
            int(np.argmax(reference.scores[len(doc["prompt"]) - 1 + i])) for i in range(STEPS)
        ]
    for step in doc["steps"]:
        assert len(step["lens"]) == doc["model"]["layers"] + 1
        last, own = step["lens"][-1]["top"], step["top"][: len(step["lens"][-1]["top"])]
        assert [entry["id"] for entry in last] == [entry["id"] for entry in own], step["index"]
        assert np.allclose([e["prob"] for e in last], [e["prob"] for e in own], rtol=0, atol=SAME_DISTRIBUTION)


def one_token(reference, word: str) -> tuple[str, int]:
    """`word` after a space where that is one token of the model's, else `word` alone (a sentencepiece
    vocabulary that adds a space before the text has it as one token without the space): the text and id."""
    for text in (" " + word, word):
        ids = reference.tokenize(text.encode(), add_bos=False, special=False)
        if len(ids) == 1:
            return text, ids[0]
    raise AssertionError(f"{word!r} is no one token of this model's")


@pytest.mark.parametrize("family", FAMILIES)
def test_steering_is_llama_cpp_pythons_own_control_vector(monkeypatch, capsys, family):
    """--steer-tokens L:S:A:B gives the tokens and logits of the control vector S × (head row of A - head
    row of B) after layer L, set through llama-cpp-python on its own Llama (llama_set_adapter_cvec)."""
    import ctypes

    import llama_cpp.llama_cpp as lib

    model = zoo_gguf(family, "Q4_K_M")
    for reference in own_llama(path=model):
        (toward, toward_id), (away, away_id) = (one_token(reference, word) for word in ("is", "in"))
        steer = f"2:8:{toward}:{away}"
        doc = trace(
            monkeypatch, capsys, "--steps", str(STEPS), "--temperature", "0", "--steer-tokens", steer, model=model
        )
        layers, hidden = lib.llama_model_n_layer(reference.model), reference.n_embd()
        control = np.zeros((layers - 1, hidden), dtype=np.float32)
        rows = head_rows([toward_id, away_id], model)
        control[2 - 1] = np.float32(8.0) * (rows[0] - rows[1])
        data = control.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        assert lib.llama_set_adapter_cvec(reference.ctx, data, control.size, hidden, 1, layers - 1) == 0
        same_logits_as(reference, doc)
        lib.llama_set_adapter_cvec(reference.ctx, None, 0, hidden, 0, 0)
        reference.reset()
        reference.eval([t["id"] for t in doc["prompt"]])
        plain = np.asarray(reference.scores[len(doc["prompt"]) - 1], dtype=np.float32)
        unsteered = doc["steps"][0]["unsteered"]["top"]
        assert [e["id"] for e in unsteered][:5] == np.argsort(-plain, kind="stable")[:5].tolist()


# Plain causal attention: llama.cpp's softmax(Q·K × scale) under the causal mask alone. (mistral too: its
# converted GGUF keeps no sliding window, so llama.cpp, reading its llama architecture, attends to every key.)
PLAIN_ATTENTION = ("llama", "qwen2", "qwen3", "mistral", "phi3", "granite", "olmo2", "qwen2_moe", "olmoe")
# A sliding window on the layers of its pattern and soft-capped logits, as gemma2.cpp and gemma3.cpp build them:
# the pattern is the GGUF's, else llama.cpp's default for the architecture (a full layer every 2nd on gemma2,
# every 6th on gemma3: llama_hparams::set_swa_pattern); gemma3 has no soft-capping.
WINDOWED_ATTENTION = ("gemma2", "gemma3_text")
SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
# phi3 names its queries again once scaled by 1/√head_dim, and attends with a scale of 1 (phi3.cpp)
QUERIES_SCALED = {"phi3"}


@pytest.mark.parametrize("family", PLAIN_ATTENTION)
def test_attention_rows_are_the_softmax_of_llama_cpps_own_queries_and_keys(family):
    """The rows shown (llama.cpp's kq_soft_max) against softmax(Q·K × scale) of the post-rotary queries and
    keys llama.cpp computed in the same pass (float16, as its kernels multiply them), within 1e-4; the
    scale is the GGUF's attention.scale where it has one (granite), else 1/√head_dim (1 where the queries
    captured are already scaled)."""
    import torch

    engine = engine_on(zoo_gguf(family, "Q4_K_M"))
    info = engine.info
    architecture = engine.runtime.metadata("general.architecture")
    scale = float(engine.runtime.metadata(f"{architecture}.attention.scale") or info.head_dim**-0.5)
    scale = 1.0 if family in QUERIES_SCALED else scale
    ids = engine.encode(PROMPT + " Paris, the capital of France.")
    for layer in range(info.layers):
        rows, reference = softmax_of_queries_and_keys(engine, ids, layer, scale)
        assert (rows - reference).abs().max() < 1e-4, (layer, float((rows - reference).abs().max()))
        assert torch.allclose(rows.sum(-1), torch.ones(info.heads, len(ids), dtype=torch.float64), atol=1e-5)


@pytest.fixture(scope="module")
def capped_gemma2(tmp_path_factory) -> Path:
    """gemma2 with its attention's logits capped at 0.5: at the zoo's 50 the cap moves no row by 1e-4 on these
    weights, so it would go untested. Made as the zoo makes its files (llama.cpp's converter and quantizer)."""
    from gguf_zoo import FAMILIES, convert, llama_cpp_sources, quantize, save_model, zoo_folder

    folder = tmp_path_factory.mktemp("capped-gemma2")
    gemma2 = FAMILIES["gemma2"]
    family = dataclasses.replace(gemma2, config={**gemma2.config, "attn_logit_softcapping": 0.5})
    model = folder / "hf"
    model.mkdir()
    save_model("gemma2", family, model)
    with FileLock(zoo_folder() / "sources.lock"):
        sources = llama_cpp_sources(zoo_folder())
    convert(sources, model, folder / "F16.gguf", family.pre)
    quantize(folder / "F16.gguf", folder / "Q4_K_M.gguf", "Q4_K_M")
    return folder / "Q4_K_M.gguf"


@pytest.mark.parametrize("family", [*WINDOWED_ATTENTION, "gemma2 capped at 0.5"])
def test_windowed_and_soft_capped_attention_rows_are_llama_cpps_own(family, request):
    """The rows shown against softmax(cap(Q·K × scale)) under the causal mask and, on a layer of the window's
    pattern, the window's (keys `sliding_window` or more positions back masked), within 1e-4; the prompt is
    longer than the window, so the window masks keys, and the rows sum to 1. On gemma2 capped at 0.5 the
    rows without the cap are off by more than 1e-3: the cap is what the rows are held to."""
    import torch

    capped = family.endswith("capped at 0.5")
    engine = engine_on(request.getfixturevalue("capped_gemma2") if capped else zoo_gguf(family, "Q4_K_M"))
    info, metadata = engine.info, engine.runtime.metadata
    architecture = metadata("general.architecture")
    window = int(metadata(f"{architecture}.attention.sliding_window"))
    pattern = int(metadata(f"{architecture}.attention.sliding_window_pattern") or SWA_PATTERN[architecture])
    softcap = float(metadata(f"{architecture}.attn_logit_softcapping") or 0.0)
    scale = float(metadata(f"{architecture}.attention.scale") or info.head_dim**-0.5)
    ids = engine.encode(PROMPT + " Paris, the capital of France.")
    assert len(ids) > 2 * window and (family != "gemma2" or softcap > 0)
    for layer in range(info.layers):
        windowed = window if layer % pattern < pattern - 1 else 0
        rows, reference = softmax_of_queries_and_keys(engine, ids, layer, scale, softcap, windowed)
        assert (rows - reference).abs().max() < 1e-4, (layer, float((rows - reference).abs().max()))
        if capped:
            _, uncapped = softmax_of_queries_and_keys(engine, ids, layer, scale, 0.0, windowed)
            assert softcap == pytest.approx(0.5) and (rows - uncapped).abs().max() > 1e-3, layer
        assert torch.allclose(rows.sum(-1), torch.ones(info.heads, len(ids), dtype=torch.float64), atol=1e-5)
        if windowed:  # the keys behind the window: none of the attention (masked, so exactly none)
            assert float(rows[:, -1, : len(ids) - windowed].abs().max()) < 1e-30, layer


# transformers' GGUF reader on: a family it reads wrongly (qwen3), one it does not take (olmoe), a sliding
# window and an MoE it reads (each a transformers load of its own: about 8 s).
READ_BY_TRANSFORMERS = ("qwen3", "olmoe", "gemma3_text", "qwen2_moe")


@pytest.mark.parametrize("family", READ_BY_TRANSFORMERS)
def test_the_default_backend_steps_each_gguf_or_says_in_one_line_why_not(monkeypatch, capsys, tmp_path, family):
    """transformers (the default backend) reads a GGUF by its own reader, which takes fewer families than
    llama.cpp: it steps the file, or refuses it in one line naming it (qwen3's ended in a traceback, exit
    1: transformers built a model whose weights' shapes differ from the file's)."""
    model = zoo_gguf(family, "Q8_0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # (transformers' dequantized copy, made here)
    code, _, err = invoke(
        monkeypatch, capsys, "trace", PROMPT, "--model", str(model), "--steps", "2", "--temperature", "0"
    )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code in (0, 2) and "Traceback" not in err, err
    assert len(errors) == (code == 2) and all(model.name in line for line in errors), err
