"""The llama.cpp backend's numbers are llama.cpp's own: each step's logits bit for bit and the greedy tokens
of llama-cpp-python's own public API (`Llama`) on the bundled GGUF, run outside tokenviz; a rewound step
gives the same logits again; and the options a GGUF cannot take are one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import invoke

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

PROMPT = "The Eiffel Tower is located in"
THREADS = 2  # both sides compute with the same threads (llama.cpp splits its sums by thread)


@pytest.fixture(scope="module")
def reference(llama_cpp):
    """llama-cpp-python's own Llama on the bundled GGUF, with the model parameters tokenviz gives it (on a CPU
    with AMX, llama.cpp's AMX kernel crashes on Q4_1: both run without the extra buffer types)."""
    import llama_cpp as package
    import llama_cpp.llama_cpp as bindings

    from tokenviz.backends.llamacpp.runtime import amx_present
    from tokenviz.system.paths import bundled_gguf

    default = bindings.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = not amx_present()
        return p

    bindings.llama_model_default_params = params
    try:
        yield package.Llama(
            model_path=str(bundled_gguf()),
            n_ctx=4096,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            logits_all=True,
            flash_attn=True,
            verbose=False,  # (llama.cpp's own default on a CPU: auto, on)
        )
    finally:
        bindings.llama_model_default_params = default


def trace(monkeypatch, capsys, *more: str) -> dict:
    args = ["trace", PROMPT, "--backend", "llama.cpp", "--threads", str(THREADS), "--json", *more]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    return json.loads(out)


def test_greedy_steps_are_llama_cpp_pythons_own_tokens_and_logits(monkeypatch, capsys, reference):
    doc = trace(monkeypatch, capsys, "--steps", "6", "--temperature", "0")
    chosen = [step["chosen"]["id"] for step in doc["steps"]]
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    assert [t["id"] for t in doc["prompt"]] == prompt
    reference.reset()
    completion = reference.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    assert doc["text"] == completion and len(chosen) == 6, (doc["text"], completion)
    reference.reset()
    reference.eval(prompt)  # (the same passes as the journey's: the prompt at once, then a token at a time)
    for i, step in enumerate(doc["steps"]):
        logits = np.asarray(reference.scores[len(prompt) - 1 + i], dtype=np.float32)
        shown = step["top"][:20]
        ids = [entry["id"] for entry in shown]
        assert [entry["logit"] for entry in shown] == logits[ids].tolist()  # bit for bit
        assert [entry["logit"] for entry in shown] == np.sort(logits)[::-1][:20].tolist()  # (ties in any order)
        probs = np.exp(logits.astype(np.float64) - logits.max())
        probs /= probs.sum()
        assert [entry["prob"] for entry in shown] == pytest.approx(probs[ids].tolist(), abs=1e-5)  # (float32 softmax)
        reference.eval([chosen[i]])
    assert doc["model"]["device"] == "cpu (llama.cpp)" and doc["model"]["dtype"] == "Q4_1"


def test_a_rewound_step_gives_the_same_logits_bit_for_bit(llama_cpp):
    import torch

    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.cli.options import ModelChoice
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    opening = Opening("trace", {"threads": THREADS}, frozenset(), ModelChoice(), SamplingSettings(temperature=0))
    session = Session(BACKEND.loader(opening)(lambda message, fraction: None), SamplingSettings(temperature=0))
    session.start(PROMPT)
    for _ in range(5):
        session.step()
    first = session.pending_logits.clone()
    session.rewind(3)
    for _ in range(3):
        session.step()
    assert torch.equal(session.pending_logits, first)
    assert session.engine.kv_len == len(session.ids) and session.engine.kv_bytes > 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model", "weights.bin"], "runs a GGUF file (--model FILE.gguf)"),
        (["--device-map", "auto"], "--device-map is the transformers backend's"),
        (["--context", "0"], "--context 0: give a whole number from 1"),
        (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint is the server backend's option"),
    ],
)
def test_what_a_gguf_in_llama_cpp_cannot_take_is_one_line(monkeypatch, capsys, args, said):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--backend", "llama.cpp", *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


def test_an_unknown_backend_is_one_line_naming_the_ones_here(monkeypatch, capsys):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--backend", "gguf")
    assert code == 2 and "--backend 'gguf': the backends here are transformers, llama.cpp, server" in err, err
