"""Steering and patching a GGUF in llama.cpp, held to llama.cpp itself driven outside tokenviz: --steer-tokens
gives the tokens and logits of the same control vector applied through llama-cpp-python (llama_set_adapter_cvec
on its own Llama), --steer by texts and --patch those of the same residuals read and written through an
evaluation callback of the test's own; the model's own distribution beside them is the plain model's; the lens
and attention rows see the steered model; taking the interventions off gives the first logits back bit for bit
(what llama.cpp cannot take: test_llamacpp_truth.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llama_reference import PROMPT, callback_context, engine_on, head_rows, offloaded
from llama_reference import trace as reference_trace

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

STEPS = 6


def trace(monkeypatch, capsys, *more: str) -> dict:
    return reference_trace(monkeypatch, capsys, "--temperature", "0", *more)


def llama_cpp_bindings():
    import llama_cpp.llama_cpp as lib

    return lib


class Context:
    """A context of its own on the reference Llama's model, with an evaluation callback that reads the
    residual after one layer (`l_out-L`) and may write one position's row of it, or change every row, as
    llama.cpp computes it."""

    def __init__(self, reference, layer: int, control: np.ndarray | None = None):
        self.name = f"l_out-{layer}".encode()
        self.lib, self.ggml, self.callback, self.ctx = callback_context(reference, self._called)
        self.hidden = self.lib.llama_model_n_embd(reference.model)
        if control is not None:
            data = control.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            layers = self.lib.llama_model_n_layer(reference.model)
            assert self.lib.llama_set_adapter_cvec(self.ctx, data, control.size, self.hidden, 1, layers - 1) == 0
        self.first, self.write, self.seen = 0, None, []
        self.change = None  # rows -> rows: every row of the tensor changed (an SAE feature's clamp)

    def _called(self, tensor, ask, user_data):
        if self.ggml.ggml_get_name(tensor) != self.name:
            return not ask
        if ask:
            return True
        size = self.ggml.ggml_nbytes(tensor)
        rows = np.empty(size // 4, dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(tensor, rows.ctypes.data, 0, size)
        rows = rows.reshape(-1, self.hidden)
        if self.write is not None and self.first <= self.write[0] < self.first + len(rows):
            rows[self.write[0] - self.first] = self.write[1]
            self.ggml.ggml_backend_tensor_set(tensor, rows.ctypes.data, 0, size)
        if self.change is not None:
            rows = np.ascontiguousarray(self.change(rows), dtype=np.float32)
            self.ggml.ggml_backend_tensor_set(tensor, rows.ctypes.data, 0, size)
        self.seen.append(rows.copy())
        return True

    def decode(self, tokens: list[int]) -> np.ndarray:
        """Feed `tokens` after what the cache holds: the logits after the last."""
        array = (self.lib.llama_token * len(tokens))(*tokens)
        assert self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(array, len(tokens))) == 0
        self.first += len(tokens)
        vocab = self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(self.lib.llama_get_model(self.ctx)))
        return np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, -1), shape=(vocab,)).copy()

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
        """The prompt at once, then a token at a time as the journey feeds them: greedy tokens, each step's logits."""
        logits, tokens, every = self.decode(prompt), [], []
        for _ in range(steps):
            every.append(logits)
            tokens.append(int(np.argmax(logits)))
            logits = self.decode([tokens[-1]])
        return tokens, every

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        self.first = 0

    def residual(self, tokens: list[int], position: int) -> np.ndarray:
        """The residual after the layer at `position` of `tokens`, read alone (from an empty cache)."""
        self.clear()
        self.seen = []
        self.decode(tokens)
        return self.seen[-1][position]

    def close(self) -> None:
        self.lib.llama_free(self.ctx)


def assert_steps(doc: dict, tokens: list[int], logits: list[np.ndarray]) -> None:
    """The trace's greedy tokens, and its top 20 logits those of the reference's steps, bit for bit."""
    assert [s["chosen"]["id"] for s in doc["steps"]] == tokens
    for step, row in zip(doc["steps"], logits):
        shown = step["top"][:20]
        assert [entry["logit"] for entry in shown] == row[[entry["id"] for entry in shown]].tolist()


def test_steering_by_tokens_is_llama_cpps_own_control_vector(monkeypatch, capsys, reference):
    """The issue's done-when: --steer-tokens '15:8: Paris: the' gives the tokens of the same control vector
    applied through llama-cpp-python directly, and the model's own distribution beside them."""
    import llama_cpp.llama_cpp as lib

    doc = trace(monkeypatch, capsys, "--steps", str(STEPS), "--steer-tokens", "15:8: Paris: the")
    paris, the = (reference.tokenize(word.encode(), add_bos=False, special=False)[0] for word in (" Paris", " the"))
    layers, hidden = lib.llama_model_n_layer(reference.model), reference.n_embd()
    control = np.zeros((layers - 1, hidden), dtype=np.float32)
    rows = head_rows([paris, the])
    control[15 - 1] = np.float32(8.0) * (rows[0] - rows[1])
    data = control.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    assert lib.llama_set_adapter_cvec(reference.ctx, data, control.size, hidden, 1, layers - 1) == 0
    try:
        reference.reset()
        text = reference.create_completion(PROMPT, max_tokens=STEPS, temperature=0)["choices"][0]["text"]
        prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
        reference.reset()
        reference.eval(prompt)
        steered = [np.asarray(reference.scores[len(prompt) - 1], dtype=np.float32)]
        for token in [s["chosen"]["id"] for s in doc["steps"]][:-1]:
            reference.eval([token])
            steered.append(np.asarray(reference.scores[reference.n_tokens - 1], dtype=np.float32))
    finally:
        lib.llama_set_adapter_cvec(reference.ctx, None, 0, hidden, 0, 0)
        reference.reset()
    assert doc["text"] == text and text.startswith(" Paris"), text  # (unsteered, " the" is likelier)
    assert_steps(doc, [int(np.argmax(row)) for row in steered], steered)
    reference.eval(prompt)
    own = np.asarray(reference.scores[len(prompt) - 1], dtype=np.float64)
    own = np.exp(own - own.max()) / np.exp(own - own.max()).sum()
    first = doc["steps"][0]
    assert first["interventions"] == ["steer L15 ×8 toward ' Paris' away from ' the'"] and first["unsteered"]["kl"] > 0
    for entry in first["unsteered"]["top"]:
        assert entry["prob"] == pytest.approx(own[entry["id"]], abs=1e-5)
    assert first["unsteered"]["top"][0]["id"] == the


def test_steering_by_texts_and_a_patch_are_llama_cpps_own_residuals(monkeypatch, capsys, reference):
    """--steer 8:4:Love:Hate adds the difference of the two texts' residuals after layer 8 (each read alone,
    at its last token) as a control vector; --patch 10:3:TEXT writes TEXT's residual after layer 10 at
    position 3 over the journey's: both as the test's own callback reads and writes them."""
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    reader = Context(reference, 8)
    try:
        love, hate = (
            reader.residual(reference.tokenize(w.encode(), add_bos=True, special=True), -1) for w in ("Love", "Hate")
        )
    finally:
        reader.close()
    layers, hidden = llama_cpp_bindings().llama_model_n_layer(reference.model), reference.n_embd()
    control = np.zeros((layers - 1, hidden), dtype=np.float32)
    control[8 - 1] = np.float32(4.0) * (love - hate)
    steered = Context(reference, 8, control)
    try:
        expected = steered.greedy(prompt, 3)
    finally:
        steered.close()
    assert_steps(trace(monkeypatch, capsys, "--steps", "3", "--steer", "8:4:Love:Hate"), *expected)

    source_text = "The dog sat on the mat"
    patcher = Context(reference, 10)
    try:
        source = patcher.residual(reference.tokenize(source_text.encode(), add_bos=True, special=True)[:4], 3)
        patcher.clear()
        patcher.write = (3, source)
        expected = patcher.greedy(prompt, 3)
    finally:
        patcher.close()
    doc = trace(monkeypatch, capsys, "--steps", "3", "--patch", f"10:3:{source_text}")
    assert_steps(doc, *expected)
    plain = trace(monkeypatch, capsys, "--steps", "1")
    assert doc["steps"][0]["top"][0]["logit"] != plain["steps"][0]["top"][0]["logit"]  # (the patch shows)


def test_the_lens_sees_the_steered_model(monkeypatch, capsys):
    """With a steering in force the lens's last layer is the steered step's distribution within 1e-3 (the
    lens reads the model the steps run), and a layer before the steering is the model's own."""
    doc = trace(monkeypatch, capsys, "--steps", "2", "--steer-tokens", "15:8: Paris: the", "--lens")
    plain = trace(monkeypatch, capsys, "--steps", "1", "--lens")
    for step in doc["steps"]:
        last = {entry["id"]: entry["prob"] for entry in step["lens"][-1]["top"]}
        for entry in step["top"][:3]:
            assert last[entry["id"]] == pytest.approx(entry["prob"], abs=1e-3)
    before, own = doc["steps"][0]["lens"][10]["top"], plain["steps"][0]["lens"][10]["top"]
    assert [e["id"] for e in before] == [e["id"] for e in own]
    assert [e["prob"] for e in before] == pytest.approx([e["prob"] for e in own], abs=1e-6)
    assert doc["steps"][0]["lens"][20]["top"] != plain["steps"][0]["lens"][20]["top"]


def test_taking_the_interventions_off_gives_the_models_own_logits_back_bit_for_bit(llama_cpp):
    """A session steered and patched, then set back: the pending step's logits are the first run's, bit for
    bit (the journey's context, opened again with the evaluation callback for the patch, is again plain)."""
    import torch

    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.interventions import parse_patch, parse_steering
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    settings = SamplingSettings(temperature=0)
    opening = Opening("trace", offloaded(), frozenset(), None, settings)
    session = Session(BACKEND.loader(opening)(lambda message, fraction: None), settings)
    session.start(PROMPT)
    for _ in range(3):
        session.step()
    first = session.pending_logits.clone()
    session.set_interventions([parse_steering("12:6: Paris: the", by="tokens"), parse_patch("10:2:The dog sat")])
    assert not torch.equal(session.pending_logits, first)
    assert session.engine.runtime.capture is not None
    for _ in range(2):
        session.step()
    steered = session.pending_logits.clone()
    session.rewind(2)
    for _ in range(2):
        session.step()
    assert torch.equal(session.pending_logits, steered)  # (the steered cache cut and fed again, bit for bit)
    session.rewind(2)
    session.set_interventions([])
    assert torch.equal(session.pending_logits, first) and session.engine.runtime.capture is None


def test_attention_rows_see_the_steered_model(llama_cpp):
    """Attention rows are read from the model the steps run: under a steering after layer 5, a layer before
    it attends as the model alone does, and a layer after it does not."""
    import torch

    from tokenviz.contract.interventions import parse_steering

    engine = engine_on()
    ids = engine.encode(PROMPT)
    rows = range(len(ids))
    plain = engine.attention(ids, rows, [3, 20])
    steering = engine.intervene(
        [parse_steering("5:8: Paris: the", by="tokens")], ids, lambda t: engine.encode(t, False)[0]
    )
    steered = engine.attention(ids, rows, [3, 20])
    assert torch.allclose(steered[0], plain[0], atol=1e-6) and not torch.allclose(steered[1], plain[1], atol=1e-3)
    steering.remove()
    assert torch.allclose(engine.attention(ids, rows, [3, 20]), plain, atol=1e-6)
