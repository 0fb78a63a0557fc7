"""The experts a mixture-of-experts model's routers chose, recorded during the journey's own forward
passes (the prompt in chunks, then one token a step), equal the routers' outputs for the same tokens
in one full forward pass without the cache."""

import json
import math

import pytest
import torch
from families import FAMILIES, family_model

from tokenviz.backends.transformers.routing import routers, shared_gates
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

gated: dict[int, torch.Tensor] = {}
MOE = [kind for kind in FAMILIES if kind in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")]
PROMPT = "The cat sat on the mat. The dog sat on the"
STEPS = 5


def routed_without_cache(model, ids: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each router's (experts, weights) for every position of one uncached forward pass; in `gated`,
    each shared expert gate's output."""
    found, out = routers(model), {}
    gated.clear()

    def chosen(module, output) -> tuple[torch.Tensor, torch.Tensor]:
        if len(output) == 2:  # Llama 4: (scores, logits), its choice the logits' top-k
            experts = torch.topk(output[1], module.top_k, dim=-1).indices
            return experts, output[0].float().gather(-1, experts)
        return output[2], output[1].float()

    handles = [
        router.register_forward_hook(lambda m, a, o, layer=layer: out.__setitem__(layer, chosen(m, o)))
        for layer, router in found.items()
    ]
    for layer, gate in shared_gates(model, found).items():  # Qwen MoE's: sigmoid(gate(x)); others always 1
        if gate is not None:
            handles.append(gate.register_forward_hook(lambda m, a, o, layer=layer: gated.__setitem__(layer, o)))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return out


def llama4_model():
    """A tiny Llama 4 (text): its router returns (every expert's score, logits), MoE every other layer."""
    from tiny import tiny_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    from tokenviz.backends.transformers.attention import use_fast_attention
    from tokenviz.backends.transformers.loading import LoadedModel
    from tokenviz.backends.transformers.model_description import model_info

    eos = tiny_tokenizer().eos_token_id
    config = AutoConfig.for_model(
        "llama4_text", vocab_size=300, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, max_position_embeddings=128, attention_chunk_size=64,
        eos_token_id=eos, bos_token_id=eos, pad_token_id=eos,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    use_fast_attention(model)
    info = model_info(model, "tiny-llama4", torch.device("cpu"), torch.float32)
    return LoadedModel(model, tiny_tokenizer(), info)


def test_the_moe_families_are_in_the_matrix():
    assert len(MOE) == 4


@pytest.mark.parametrize("kind", [*MOE, "llama4_text"])
def test_recorded_routing_equals_the_routers_without_the_cache(kind):
    loaded = llama4_model() if kind == "llama4_text" else family_model(kind)
    # The prompt in passes of 4 tokens: their routing joined in order.
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=100), prefill_chunk=4)
    session.start(session.engine.encode(PROMPT))
    for _ in range(STEPS):
        session.step()
    fed = session.ids  # (the pending decision's token is not among them)
    expected = routed_without_cache(loaded.model, fed)
    layers = sorted(expected)
    assert layers and session.records[0].routing.layers == tuple(layers)
    prompt = len(session.prompt_ids)
    recorded = [session.records[0].routing.at(i) for i in range(prompt)]
    recorded += [record.routing.at(-1) for record in session.records[1:]]
    assert len(recorded) == len(fed)
    for position, routes in enumerate(recorded):
        for route in routes:
            experts, weights = expected[route.layer]
            assert route.experts == tuple(experts[position].tolist())
            assert route.weights == pytest.approx(weights[position].tolist(), abs=1e-5)
            assert 0 <= route.entropy <= math.log2(routers(loaded.model)[route.layer].num_experts) + 1e-6
            if kind == "qwen2_moe":
                assert route.shared == pytest.approx(torch.sigmoid(gated[route.layer][position]).item(), abs=1e-5)
            else:  # Llama 4's and DeepSeek's shared experts always count in full; Mixtral and Qwen3-MoE have none
                assert route.shared == (1.0 if kind in ("llama4_text", "deepseek_v3") else None)


@pytest.mark.parametrize("kind", ["mixtral", "llama"])
def test_trace_routing_json_and_a_dense_model(kind, tmp_path, monkeypatch, capsys):
    from clitools import invoke

    saved = family_model(kind)
    saved.model.save_pretrained(tmp_path)
    saved.tokenizer.save_pretrained(tmp_path)
    args = ["trace", PROMPT, "--model", str(tmp_path), "--steps", "3", "--temperature", "0", "--routing", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args)
    if kind == "llama":
        assert code == 2 and "has no mixture-of-experts layers" in err
        return
    assert code == 0, err
    doc = json.loads(out)
    moe_layers = len(routers(saved.model))
    assert len(doc["prompt_routing"]) == len(doc["prompt"])
    assert doc["steps"][0]["routing"] == doc["prompt_routing"][-1]  # step 0: the last prompt token's pass
    for step in doc["steps"]:
        assert len(step["routing"]) == moe_layers
        assert all(
            len(r["experts"]) == len(r["weights"]) == saved.model.config.num_experts_per_tok for r in step["routing"]
        )


def test_a_saved_journey_keeps_its_routing_and_a_damaged_one_is_refused(tmp_path):
    from tokenviz.contract.errors import TokenvizError
    from tokenviz.files.journey_file import read_journey, save_journey, snapshot_from_journey
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(family_model("mixtral")), SamplingSettings(temperature=0))
    session.start(session.engine.encode(PROMPT))
    for _ in range(3):
        session.step()
    path = save_journey(tmp_path / "moe.json", snapshot_of(session))
    replayed = snapshot_from_journey(read_journey(path))
    assert [r.routing for r in replayed.records] == [r.routing for r in session.records]
    assert replayed.records[2].routing.at(-1) == session.records[2].routing.at(-1)
    doc = json.loads(path.read_text())
    doc["replay"]["records"][1]["routing"]["positions"] = 2  # the record fed one token
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TokenvizError):
        read_journey(tmp_path / "bad.json")


def _set_expert(doc: dict, record: int, expert: int) -> None:
    """Name `expert` as the first expert of `record`'s routing, in place (the file's base64 uint16s)."""
    import base64

    import numpy as np

    routing = doc["replay"]["records"][record]["routing"]
    experts = np.frombuffer(base64.b64decode(routing["experts"]), dtype=np.uint16).copy()
    experts[0] = expert
    routing["experts"] = base64.b64encode(experts.tobytes()).decode()


def test_routing_naming_an_expert_the_model_lacks_is_refused_and_verify_compares_the_experts(tmp_path):
    from tokenviz.contract.errors import TokenvizError
    from tokenviz.files.journey_file import open_journey, save_journey
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(family_model("mixtral")), SamplingSettings(temperature=0))
    experts = session.engine.info.experts
    assert experts == session.engine.model.config.num_local_experts > 1
    session.start(session.engine.encode(PROMPT))
    for _ in range(3):
        session.step()
    path = save_journey(tmp_path / "moe.json", snapshot_of(session))
    doc = json.loads(path.read_text())
    assert doc["replay"]["info"]["experts"] == experts

    _set_expert(bad := json.loads(path.read_text()), 1, 32_767)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(TokenvizError, match=f"names expert 32767; the model has 0-{experts - 1}"):
        open_journey(tmp_path / "bad.json")

    fresh = Session(ModelRunner(family_model("mixtral")))
    assert verify_journey(open_journey(path), fresh) == (3, None)
    recorded = json.loads(path.read_text())
    first = recorded["replay"]["records"][2]["routing"]
    import base64

    import numpy as np

    chosen = int(np.frombuffer(base64.b64decode(first["experts"]), dtype=np.uint16)[0])
    _set_expert(recorded, 2, (chosen + 1) % experts)  # another expert, one the model has
    (tmp_path / "rerouted.json").write_text(json.dumps(recorded))
    fresh = Session(ModelRunner(family_model("mixtral")))
    assert verify_journey(open_journey(tmp_path / "rerouted.json"), fresh) == (3, 2)  # (it said "verified")
