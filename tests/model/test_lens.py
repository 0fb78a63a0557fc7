"""Inside a position: logit lens, embeddings, residual norms; and verifying the cache."""

import itertools
import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.backends.shared.output_head import final_norm
from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.lens import inspect_positions
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.journey.verification import verify_latest

PROMPT = "The Eiffel Tower is located in"


def journey(loaded, steps=5, **settings):
    s = Session(ModelRunner(loaded), SamplingSettings(**settings))
    s.start(PROMPT)
    for _ in range(steps):
        s.step()
    return s


def test_last_layer_lens_equals_the_models_output(tiny):
    s = journey(tiny)
    position = len(s.ids) - 1
    inspection = s.analyses.inspect(position)
    assert len(inspection.lens) == tiny.info.layers + 1
    last = inspection.lens[-1]
    pending = s.pending
    assert [i for i, _, _ in last.top] == [c.id for c in pending.top[: len(last.top)]]
    for (_, _, p), c in zip(last.top, pending.top):
        assert p == pytest.approx(c.prob, abs=1e-5)
    assert last.chosen_rank == pending.decision.raw_rank
    assert last.chosen_prob == pytest.approx(pending.decision.raw_prob, abs=1e-5)


def test_each_layer_is_normed_and_unembedded_on_its_own(tiny_llama):
    s = journey(tiny_llama)
    model = tiny_llama.model
    position = len(s.prompt_ids) + 1
    captured = []
    handles = [
        layer.register_forward_hook(lambda m, a, o: captured.append(o[0] if isinstance(o, tuple) else o))
        for layer in decoder_layers(model)
    ]
    with torch.inference_mode():
        model(torch.tensor([s.ids[: position + 1]]))
    for h in handles:
        h.remove()
    inspection = s.analyses.inspect(position)
    for layer, out in enumerate(captured, start=1):
        probs = torch.softmax(model.lm_head(final_norm(model)(out[0, position])), -1)
        top = torch.topk(probs, 3)
        assert [i for i, _, _ in inspection.lens[layer].top] == top.indices.tolist()
        assert inspection.lens[layer].residual_norm == pytest.approx(float(out[0, position].norm()), rel=1e-5)
    assert inspection.chosen_id == s.ids[position + 1]


def test_embedding_view_states_the_facts(tiny):
    s = journey(tiny, steps=1)
    inspection = s.analyses.inspect(2)
    row = tiny.model.get_input_embeddings().weight[s.ids[2]].detach()
    assert inspection.token_id == s.ids[2]
    assert inspection.embedding_head == pytest.approx(row[:16].tolist())
    assert inspection.embedding_norm == pytest.approx(float(row.norm()), rel=1e-5)
    expected = "rotary" if tiny.info.architecture.startswith("Llama") else "learned absolute"
    assert inspection.positions.startswith(expected)
    assert inspection.tied_embeddings == tiny.info.tied_embeddings


def test_first_top1_layer():
    from tokenviz.contract.results import Inspection, LensLayer

    def row(layer, rank):
        return LensLayer(layer=layer, top=(), chosen_rank=rank, chosen_prob=0.1, residual_norm=1.0)

    def inspection(ranks):
        return Inspection(0, 0, "", 0, (), 1.0, True, "", tuple(row(i, r) for i, r in enumerate(ranks)))

    assert inspection([5, 1, 3, 1, 1]).first_top1_layer == 3
    assert inspection([1, 1, 1]).first_top1_layer == 0
    assert inspection([2, 2, 1, 2]).first_top1_layer is None


def test_verify_finds_cached_and_full_recompute_agree(tiny):
    s = journey(tiny, steps=8)
    before = (list(s.ids), s.engine.kv_len, s.pending.decision)
    v = verify_latest(s.engine, s.cached_ids)
    assert v.position == len(s.ids) - 1 and v.argmax_agrees
    assert v.max_logit_diff < 1e-4 and v.max_attention_diff < 1e-5
    assert (list(s.ids), s.engine.kv_len, s.pending.decision) == before  # the cache is as it was
    s.step()
    assert s.records[-1].kv_len == len(s.ids)


def test_rewind_reports_the_shared_prefix(tiny_llama):
    s = journey(tiny_llama, steps=6)
    s.rewind(4)
    assert s.last_cache_event.kept == len(s.ids) and s.last_cache_event.dropped == 4


@pytest.mark.bundled
def test_trace_lens_on_the_bundled_model(monkeypatch, capsys):
    from tokenviz.cli import run

    monkeypatch.setattr(
        sys, "argv", ["tokenviz", "trace", PROMPT, "--steps", "3", "--temperature", "0", "--lens", "--json"]
    )
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert exit_info.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    for step in doc["steps"]:
        lens = step["lens"]
        assert len(lens) == doc["model"]["layers"] + 1 and [r["layer"] for r in lens] == list(range(31))
        last = lens[-1]
        assert last["top"][0]["id"] == step["top"][0]["id"] == step["chosen"]["id"]
        assert last["top"][0]["prob"] == pytest.approx(step["top"][0]["prob"], abs=1e-4)
        assert last["chosen_rank"] == 1
        first = step["lens_first_top1_layer"]
        assert first is not None and all(r["chosen_rank"] == 1 for r in lens[first:])
        assert lens[0]["norm"] > 0


def test_lens_for_many_positions_in_one_pass_matches_one_by_one(tiny_llama):
    s = journey(tiny_llama, steps=4)
    n = len(s.prompt_ids)
    positions = [n - 1 + i for i in range(4)]
    chosen = [s.ids[p + 1] for p in positions]
    together = inspect_positions(s.engine, s.ids[: positions[-1] + 1], positions, chosen)
    for inspection, p in zip(together, positions):
        alone = s.analyses.inspect(p)
        assert [r.top for r in inspection.lens] == [r.top for r in alone.lens] or all(
            [i for i, _, _ in a.top] == [i for i, _, _ in b.top] for a, b in zip(inspection.lens, alone.lens)
        )


def save_gemma3n(directory) -> str:
    """A tiny Gemma 3n: four parallel streams per layer (AltUp), merged after the last layer."""
    from families import gemma3n_config
    from tiny import tiny_tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(gemma3n_config()).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return str(directory)


def test_gemma3n_lens_follows_its_streams_to_the_models_output(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    directory = save_gemma3n(tmp_path)
    capsys.readouterr()
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--model", directory, "--steps", "3",
                            "--temperature", "0", "--lens", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    for step in doc["steps"]:
        lens = step["lens"]
        assert len(lens) == 5 and lens[-1]["top"][0]["id"] == step["chosen"]["id"]
        assert lens[-1]["top"][0]["prob"] == pytest.approx(step["top"][0]["prob"], abs=1e-5)


@pytest.mark.parametrize(
    "merge, said",
    [
        (lambda model: None, "logit lens cannot follow"),  # as the lens was before it followed AltUp
        (lambda model: lambda streams: streams[0], "is not exact"),  # one stream only: the wrong numbers
    ],
)
def test_a_lens_that_cannot_be_exact_says_so_in_one_line(tmp_path, monkeypatch, capsys, merge, said):
    from clitools import invoke

    from tokenviz.backends.transformers import lens

    directory = save_gemma3n(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr(lens, "stream_merge", merge)
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--model", directory, "--steps", "2", "--lens")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err


def tiny_lfm2():
    """A tiny LFM2 (all its layers attention, as tokenviz opens it): its final norm is `embedding_norm`."""
    from families import COMMON, KV_HEADS, model_of
    from transformers import AutoConfig

    config = AutoConfig.for_model("lfm2", **COMMON, num_key_value_heads=KV_HEADS, layer_types=["full_attention"] * 4)
    return model_of(config, "tiny-lfm2")


def test_a_final_norm_by_another_name_is_found_and_the_lens_is_exact():
    loaded = tiny_lfm2()
    assert final_norm(loaded.model) is loaded.model.model.embedding_norm
    s = journey(loaded, steps=2, temperature=0)
    last = s.analyses.inspect(len(s.ids) - 1).lens[-1]
    assert [i for i, _, _ in last.top] == [c.id for c in s.pending.top[: len(last.top)]]
    assert [p for _, _, p in last.top] == pytest.approx([c.prob for c in s.pending.top[: len(last.top)]], abs=1e-5)


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda base: setattr(base, "embedding_norm", torch.nn.Identity()), "it has no final norm"),
        (lambda base: setattr(base, "other_norm", type(base.embedding_norm)(8)), "which of its norms"),
    ],
)
def test_a_final_norm_that_cannot_be_told_is_one_line(change, said):
    from tokenviz.contract.errors import TokenvizError

    model = tiny_lfm2().model
    change(model.model)
    with pytest.raises(TokenvizError, match=said):
        final_norm(model)


def test_lens_layers_choose_rows_by_the_names_the_panes_use():
    from tokenviz.contract.errors import TokenvizError
    from tokenviz.contract.lens_layers import LensLayers, parse_lens_layers

    assert parse_lens_layers("emb,0-29/4,last").rows(30) == (0, 1, 5, 9, 13, 17, 21, 25, 29, 30)
    assert parse_lens_layers(" 3 , 1-2,emb").rows(4) == (0, 2, 3, 4)
    assert LensLayers.of_rows([0, 4, 30]).rows(30) == (0, 4, 30)
    for spec, said in (("5-2", "from the lower layer up"), ("0-9/0", "chooses nothing"), ("x", "give emb, last")):
        with pytest.raises(TokenvizError, match=said):
            parse_lens_layers(spec)
    with pytest.raises(TokenvizError, match="layers are 0 to 3"):
        parse_lens_layers("emb,4").rows(4)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(0, 250))
def test_a_view_spreads_the_rows_it_has_room_for_over_the_whole_depth(rows, room):
    from tokenviz.contract.lens_layers import spread

    chosen = spread(range(rows), room)
    assert list(chosen) == sorted(set(chosen)) and set(chosen) <= set(range(rows))
    assert len(chosen) == min(rows, room)  # (as many as fit: no row twice)
    if room >= 2:
        assert chosen[0] == 0 and chosen[-1] == rows - 1  # the embeddings and the model's own last row
        gaps = [b - a for a, b in itertools.pairwise(chosen)]
        assert not gaps or max(gaps) - min(gaps) <= 1  # evenly
    elif room == 1:
        assert chosen == (rows - 1,)


def test_a_lens_of_some_rows_is_those_rows_of_the_whole_lens_and_kept_ones_cost_nothing(tiny_llama):
    session = journey(tiny_llama, steps=2)
    engine = session.engine
    position = len(session.ids) - 2
    some = session.analyses.inspect(position, (0, 2, 3))
    assert [row.layer for row in some.lens] == [0, 2, 3]
    whole = session.analyses.inspect(position)
    assert [row.layer for row in whole.lens] == list(range(engine.info.layers + 1))
    for row in some.lens:
        same = whole.lens[row.layer]
        assert [t[0] for t in row.top] == [t[0] for t in same.top] and row.chosen_rank == same.chosen_rank
        assert max(abs(a[2] - b[2]) for a, b in zip(row.top, same.top)) < 1e-6  # (float32: the rows' matmul)
        assert abs(row.chosen_prob - same.chosen_prob) < 1e-6
    asked = []
    inspect = engine.inspect
    engine.inspect = lambda ask: asked.append(ask) or inspect(ask)
    again = session.analyses.inspect(position, (1, 3))  # (rows of the whole lens kept: nothing computed)
    assert [row.layer for row in again.lens] == [1, 3] and asked == []
    with pytest.raises(TokenvizError, match="not among the model's"):
        session.analyses.inspect(position, (0, engine.info.layers + 1))


def test_trace_lens_layers_gives_those_rows_of_the_whole_lens(tmp_path, monkeypatch, capsys):
    """(Round 6, finding 2: a view asks only for the lens rows it shows.) `--lens-layers` gives exactly the rows
    it names, each equal to the same row of the whole lens; a layer the model lacks is one line, exit 2."""
    from clitools import invoke
    from tiny import save_tiny

    directory = save_tiny(tmp_path / "m", "llama")
    common = ["trace", PROMPT, "--model", directory, "--steps", "3", "--temperature", "0", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *common, "--lens")
    assert code == 0, err
    whole = json.loads(out)
    layers = whole["model"]["layers"]
    code, out, err = invoke(monkeypatch, capsys, *common, "--lens-layers", "emb,1,last")
    assert code == 0, err
    chosen = json.loads(out)
    for full, part in zip(whole["steps"], chosen["steps"]):
        assert [row["layer"] for row in part["lens"]] == [0, 2, layers]
        for row in part["lens"]:
            same = full["lens"][row["layer"]]
            assert row["chosen_prob"] == pytest.approx(same["chosen_prob"], abs=1e-6)
            assert [t["id"] for t in row["top"]] == [t["id"] for t in same["top"]]
    code, out, err = invoke(monkeypatch, capsys, *common, "--lens-layers", str(layers))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and f"layers are 0 to {layers - 1}" in errors[0], err
    code, out, err = invoke(monkeypatch, capsys, *common, "--lens-layers", "1..3")
    assert code == 2 and "give emb, last, N, N-M or N-M/K" in err and "Traceback" not in err


def test_the_lens_at_the_step_just_taken_is_read_in_that_steps_own_pass(tiny):
    """While the lens is in use, a step keeps its token's residual stream: the lens at the step just taken
    runs no pass of its own (its cost is the head's, not the context's length) and gives what a pass over
    the whole context gives (within 1e-5 in probability: a cached and an uncached pass sum in other
    orders); a rewind forgets what was kept, and a closed lens keeps nothing."""
    from tokenviz.backends.shared.lens_in_use import IN_USE_STEPS

    loaded = tiny
    s = journey(loaded, steps=1)
    passes: list[int] = []
    handle = loaded.model.register_forward_pre_hook(lambda m, a, k: passes.append(1), with_kwargs=True)
    try:
        for _ in range(4):
            s.step()
            before = len(passes)
            shown = s.analyses.inspect(len(s.ids) - 2)
            fed_here = len(passes) - before
        assert fed_here == 0  # (the step's own pass read it)
        position = len(s.ids) - 2
        s.engine.step_lens.forget_from(0)
        again = inspect_positions(s.engine, s.ids[: position + 1], [position], [s.ids[position + 1]])[0]
        assert again.position == shown.position == position
        for ours, whole in zip(shown.lens, again.lens, strict=True):
            assert [t[0] for t in ours.top] == [t[0] for t in whole.top]
            assert [t[2] for t in ours.top] == pytest.approx([t[2] for t in whole.top], abs=1e-5)
            assert ours.residual_norm == pytest.approx(whole.residual_norm, rel=1e-4)
        s.step()
        s.rewind(1)
        assert s.engine.step_lens.kept.keys() <= set(range(s.engine.kv_len))
        for _ in range(IN_USE_STEPS + 1):
            s.step()
        assert s.engine.step_lens.kept == {} or max(s.engine.step_lens.kept) < s.engine.kv_len - 1
    finally:
        handle.remove()
