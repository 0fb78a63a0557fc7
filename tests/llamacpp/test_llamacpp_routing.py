"""An MoE GGUF's routing on llama.cpp (the zoo's qwen2moe, with a gated shared expert, and olmoe, converted
and quantized by llama.cpp's own tools) held to the router's probabilities llama.cpp computes, read by the
test's own evaluation callback on llama-cpp-python's own model outside tokenviz, fed as the journey feeds
it: each position's experts are the k most probable, their weights those probabilities (neither family
renormalises them), the entropy the probabilities', the shared expert's weight its gate; in --json and in
the app's routing view."""

from __future__ import annotations

import numpy as np
import pytest
from apptools import settle, wait_for
from gguf_zoo import zoo_gguf
from llama_reference import PROMPT, callback_context, offloaded, own_llama, trace

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

MOE = ("qwen2_moe", "olmoe")
STEPS = 4
SAME_FLOAT = 1e-6  # a weight is the probability itself (a copy); float32 throughout
ENTROPY = 1e-4  # bits: tokenviz's from the router's logits in float64, the test's from its float32 softmax


class RouterReader:
    """A context on llama-cpp-python's own model with an evaluation callback keeping each MoE layer's
    router probabilities (ffn_moe_probs-L: experts × tokens) and shared-expert gate (ffn_shexp_gate-L)."""

    def __init__(self, reference):
        self.lib, self.ggml, self.callback, self.ctx = callback_context(reference, self._called)
        self.seen: dict[str, list[np.ndarray]] = {}
        self.fed = 0

    def _called(self, tensor, ask, user_data):
        name = self.ggml.ggml_get_name(tensor).decode()
        wanted = name.startswith(("ffn_moe_probs-", "ffn_shexp_gate-"))
        if ask or not wanted:
            return wanted if ask else True
        data = np.empty(self.ggml.ggml_nbytes(tensor) // 4, dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, data.nbytes)
        self.seen.setdefault(name, []).append(data)
        return True

    def decode(self, tokens: list[int]) -> None:
        """Feed `tokens` with every position's logits asked (as tokenviz's prefill does: llama.cpp keeps
        the last layer's rows of those positions alone)."""
        lib = self.lib
        batch = lib.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, self.fed + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, True
            batch.n_tokens = len(tokens)
            assert lib.llama_decode(self.ctx, batch) == 0
        finally:
            lib.llama_batch_free(batch)
        self.fed += len(tokens)

    def routes(self, layers: list[int], experts: int, k: int) -> list[list[dict]]:
        """What the fed positions' routing should be, from the probabilities read: per position, per layer."""
        probs = {n: np.concatenate(self.seen[f"ffn_moe_probs-{n}"]).reshape(-1, experts) for n in layers}
        gates = {
            n: np.concatenate(self.seen[f"ffn_shexp_gate-{n}"]) for n in layers if f"ffn_shexp_gate-{n}" in self.seen
        }
        every = []
        for position in range(self.fed):
            at = []
            for n in layers:
                p = probs[n][position]
                chosen = np.argsort(-p, kind="stable")[:k]
                entropy = float(-(p.astype(np.float64) * np.log2(p.astype(np.float64))).sum())
                shared = float(gates[n][position]) if n in gates else None
                at.append(
                    {
                        "layer": n,
                        "experts": chosen.tolist(),
                        "weights": p[chosen].tolist(),
                        "entropy": entropy,
                        "shared": shared,
                    }
                )
            every.append(at)
        return every

    def close(self) -> None:
        self.lib.llama_free(self.ctx)


def assert_same_routes(shown: list[dict], expected: list[dict], where: str) -> None:
    assert [r["layer"] for r in shown] == [r["layer"] for r in expected], where
    for got, want in zip(shown, expected):
        assert got["experts"] == want["experts"], (where, got, want)
        assert np.allclose(got["weights"], want["weights"], rtol=0, atol=SAME_FLOAT), (where, got, want)
        assert abs(got["entropy"] - want["entropy"]) < ENTROPY, (where, got, want)
        if want["shared"] is None:
            assert got["shared"] is None, where
        else:
            assert abs(got["shared"] - want["shared"]) < SAME_FLOAT, (where, got, want)


@pytest.mark.parametrize("kind", ["F16", "Q4_K_M"])
@pytest.mark.parametrize("family", MOE)
def test_trace_routing_is_the_routers_choice_llama_cpp_computed(monkeypatch, capsys, family, kind):
    model = zoo_gguf(family, kind)
    doc = trace(monkeypatch, capsys, "--steps", str(STEPS), "--temperature", "0", "--routing", model=model)
    assert "routing" in doc["model"]["capabilities"] and doc["model"]["experts"] == 4
    layers = [route["layer"] for route in doc["prompt_routing"][0]]
    assert layers == [0, 1, 2, 3]
    for reference in own_llama(path=model):
        reader = RouterReader(reference)
        try:
            reader.decode([t["id"] for t in doc["prompt"]])
            for step in doc["steps"][:-1]:
                reader.decode([step["chosen"]["id"]])
            expected = reader.routes(layers, experts=4, k=2)
        finally:
            reader.close()
    prompt = len(doc["prompt"])
    assert len(doc["prompt_routing"]) == prompt
    for position, shown in enumerate(doc["prompt_routing"]):
        assert_same_routes(shown, expected[position], f"prompt position {position}")
    for i, step in enumerate(doc["steps"]):
        assert_same_routes(step["routing"], expected[prompt - 1 + i], f"step {i}")
    assert all(r["shared"] is not None for r in doc["steps"][0]["routing"]) == (family == "qwen2_moe")


async def test_the_routing_view_shows_llama_cpps_routing_at_the_cursor():
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.routing import routes_at
    from tokenviz.worker.engine_thread import EngineWorker

    greedy = SamplingSettings(temperature=0)
    opening = Opening("app", offloaded(), frozenset(), str(zoo_gguf("qwen2_moe", "Q4_K_M")), greedy)
    app = TokenvizApp(EngineWorker(BACKEND.loader(opening), greedy, PROMPT))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot, timeout=120)
        await pilot.press("s", "s")
        s = await settle(app, pilot, timeout=120)
        await pilot.press("R")
        await wait_for(lambda: app.query_one("#views").current == "routing", pilot)
        pane = app.query_one("#routing")
        await wait_for(lambda: "L0" in str(pane.body.render()), pilot, timeout=60)
        shown = str(pane.body.render())
        routes = routes_at(s, app.journey.current_selection().cursor)
        assert routes is not None and len(routes) == 4
        for route in routes:
            row = next(line for line in shown.splitlines() if line.startswith(f"L{route.layer} "))
            assert f"e{route.experts[0]}" in row and f"{route.weights[0]:4.2f}" in row, (row, route)
