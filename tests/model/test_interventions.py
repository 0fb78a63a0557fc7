"""Interventions against the same change made by a plain PyTorch hook: every step's logits (with the
KV cache) equal the hooked model's full forward without the cache, greedy tokens equal generate()
with the hook, and the unsteered distribution is the model's own; on every family of the matrix."""

import math

import pytest
import torch
from families import FAMILIES, family_config, family_model
from tiny import eager_forward

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.interventions import HeadAblation, Patch, Steering, parse_ablation, parse_patch, parse_steering
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.prompt import tokenize
from tokenviz.journey.session import Session

# Where each family keeps its attention output projection, named here by hand (not by tokenviz).
PROJECTION = {
    "phi": "self_attn.dense",
    "gpt2": "attn.c_proj",
    "gpt_neo": "attn.attention.out_proj",
    "gpt_neox": "attention.dense",
    "gptj": "attn.out_proj",
    "opt": "self_attn.out_proj",
    "bloom": "self_attention.dense",
    "xglm": "self_attn.out_proj",
    "biogpt": "self_attn.out_proj",
    "mpt": "attn.out_proj",
    "falcon": "self_attention.dense",
    "gpt_bigcode": "attn.c_proj",
    "codegen": "attn.out_proj",
}
LAYER, HEAD, HEADS, STEPS = 1, 2, 4, 4
PROMPT = "The cat sat on"


def reference_ablation(model, kind: str, value: torch.Tensor | None = None):
    """A pre-hook on the output projection that sets head HEAD's slice of its input."""
    projection = decoder_layers(model)[LAYER].get_submodule(PROJECTION.get(kind, "self_attn.o_proj"))

    def pre_hook(module, args):
        x = args[0].clone()
        width = x.shape[-1] // HEADS
        x[..., HEAD * width : (HEAD + 1) * width] = 0 if value is None else value
        return (x, *args[1:])

    return projection.register_forward_pre_hook(pre_hook)


def reference_steering(model, vector: torch.Tensor):
    def hook(module, args, output):
        if isinstance(output, tuple):
            return (output[0] + vector, *output[1:])
        return output + vector

    return decoder_layers(model)[LAYER].register_forward_hook(hook)


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def journey(kind: str, interventions, steps: int = STEPS) -> Session:
    session = Session(ModelRunner(family_model(kind)), SamplingSettings(temperature=0, max_new_tokens=steps))
    _, ids, _ = tokenize(session.engine, PROMPT)
    session.set_interventions(interventions, context=ids)
    session.start(PROMPT)
    while session.step() is not None:
        pass
    return session


def check_steps(session: Session, reference) -> None:
    """Each step's top logits equal the full forward at its context of the model with the `reference`
    hooks (1e-5) and tokenviz's suspended; its unsteered top and KL are the model's own."""
    model = session.engine.model
    contexts = [session.ids[: r.position] for r in session.records]
    with session.intervening.hooks.suspended():
        owns = [full_logits(model, context) for context in contexts]
        handles = reference()
        try:
            expecteds = [full_logits(model, context) for context in contexts]
        finally:
            for handle in handles:
                handle.remove()
    for record, expected, own in zip(session.records, expecteds, owns):
        ids = [c.id for c in record.top]
        torch.testing.assert_close(torch.tensor([c.logit for c in record.top]), expected[ids], atol=1e-5, rtol=1e-5)
        assert record.decision.chosen_id == int(expected.argmax())
        unsteered = record.unsteered
        torch.testing.assert_close(
            torch.tensor([c.logit for c in unsteered.top]), own[[c.id for c in unsteered.top]], atol=1e-5, rtol=1e-5
        )
        p, q = torch.log_softmax(expected.double(), -1), torch.log_softmax(own.double(), -1)
        kl = float((p.exp() * (p - q)).sum()) / math.log(2)
        assert unsteered.kl == pytest.approx(kl, abs=1e-4)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_zero_ablated_head_equals_a_plain_pre_hook_with_and_without_the_cache(kind):
    session = journey(kind, [HeadAblation(LAYER, HEAD)])
    model = session.engine.model
    session.intervening.remove()  # only the reference hook from here
    handle = reference_ablation(model, kind)
    try:
        check_steps_against(session, model)
        generated = model.generate(
            torch.tensor([session.prompt_ids]),
            attention_mask=torch.ones(1, len(session.prompt_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=STEPS,
        )[0, len(session.prompt_ids) :].tolist()
    finally:
        handle.remove()
    assert session.generated_ids == generated


def check_steps_against(session: Session, hooked_model) -> None:
    for record in session.records:
        expected = full_logits(hooked_model, session.ids[: record.position])
        ids = [c.id for c in record.top]
        torch.testing.assert_close(torch.tensor([c.logit for c in record.top]), expected[ids], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_steering_by_two_texts_equals_a_plain_forward_hook_and_unsteered_is_the_models_own(kind):
    steering = Steering(LAYER, 4.0, "cats and kittens", "dogs and puppies")
    session = journey(kind, [steering])
    model, runner = session.engine.model, session.engine
    with session.intervening.hooks.suspended(), torch.no_grad():  # the direction, read the plain way
        states = [
            model(torch.tensor([runner.encode(t)]), output_hidden_states=True).hidden_states[LAYER + 1][0, -1]
            for t in (steering.toward, steering.away)
        ]
    vector = 4.0 * (states[0] - states[1])
    check_steps(session, lambda: [reference_steering(model, vector)])


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", "olmo2", "gptj", "falcon"])
def test_a_mean_ablation_and_steering_by_tokens_equal_plain_hooks(kind):
    loaded = family_model(kind)
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=STEPS))
    _, prompt, _ = tokenize(session.engine, PROMPT)
    model = loaded.model
    seen = []
    projection = decoder_layers(model)[LAYER].get_submodule(PROJECTION.get(kind, "self_attn.o_proj"))
    handle = projection.register_forward_pre_hook(lambda m, args: seen.append(args[0][0]))
    full_logits(model, prompt)
    handle.remove()
    width = seen[0].shape[-1] // HEADS
    mean = seen[0][:, HEAD * width : (HEAD + 1) * width].mean(0)
    toward, away = session.engine.encode("a", False)[0], session.engine.encode("b", False)[0]
    unembedding = model.get_output_embeddings().weight
    vector = -2.0 * (unembedding[toward] - unembedding[away])
    session.set_interventions(
        [HeadAblation(LAYER, HEAD, mean=True), Steering(LAYER, -2.0, f"id:{toward}", f"id:{away}", by="tokens")],
        context=prompt,
    )
    session.start(PROMPT)
    while session.step() is not None:
        pass
    check_steps(session, lambda: [reference_ablation(model, kind, mean), reference_steering(model, vector)])


def no_hooks_on(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_scale_zero_equals_no_intervention_and_turning_them_off_leaves_no_hook(kind):
    plain = journey(kind, [])
    zero = journey(kind, [Steering(LAYER, 0.0, "cats", "dogs")])
    assert [r.top for r in zero.records] == [r.top for r in plain.records]  # exactly: + 0 changes nothing
    assert all(r.unsteered.kl == 0 for r in zero.records)
    zero.rewind(1)
    zero.set_interventions([])  # the pending step is re-decided by the model as it is
    assert no_hooks_on(zero.engine.model) and no_hooks_on(plain.engine.model)
    assert zero.pending.unsteered is None and zero.pending.interventions == ()
    same_top(zero.pending.top, plain.records[-1].top)


def same_top(a, b) -> None:
    """The same candidates, their logits equal to float32 rounding (a cache fed again in other chunks)."""
    assert [c.id for c in a] == [c.id for c in b]
    torch.testing.assert_close(torch.tensor([c.logit for c in a]), torch.tensor([c.logit for c in b]))


def test_an_intervention_set_mid_journey_re_decides_the_pending_token_and_rewinds_follow_it():
    session = journey("llama", [], steps=8)
    session.rewind(4)
    plain_pending = session.pending
    session.set_interventions([HeadAblation(LAYER, HEAD)])
    model = session.engine.model
    assert session.pending.interventions == (HeadAblation(LAYER, HEAD),)
    with session.intervening.hooks.suspended():
        handle = reference_ablation(model, "llama")
        try:
            check_steps_against_pending(session, model)
            for _ in range(3):
                session.step()  # (the session's hooks are suspended: the reference one stands for them)
        finally:
            handle.remove()
    session.set_interventions([])
    session.rewind(3)
    same_top(session.pending.top, plain_pending.top)
    assert session.pending.unsteered is None


def check_steps_against_pending(session: Session, hooked_model) -> None:
    expected = full_logits(hooked_model, session.ids)
    top = session.pending.top
    torch.testing.assert_close(
        torch.tensor([c.logit for c in top]), expected[[c.id for c in top]], atol=1e-5, rtol=1e-5
    )


def test_interventions_outside_the_model_or_misspelt_are_one_line():
    session = Session(ModelRunner(family_model("llama")))
    with pytest.raises(SettingsError, match="layers are 0-3"):
        session.set_interventions([HeadAblation(7, 0)])
    with pytest.raises(SettingsError, match="heads are 0-3"):
        session.set_interventions([HeadAblation(0, 9)])
    assert session.interventions == () and no_hooks_on(session.engine.model)
    with pytest.raises(SettingsError, match=r"LAYER\.HEAD"):
        parse_ablation("5")
    with pytest.raises(SettingsError, match="LAYER:SCALE:TOWARD:AWAY"):
        parse_steering("6:4:Love")
    assert parse_steering("6:-4:a:b:c") == Steering(6, -4.0, "a", "b:c")


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_patch_from_another_prompt_equals_a_plain_forward_hook(kind):
    source = "The dog ran up"
    session = journey(kind, [Patch(LAYER, 2, source)])
    model, runner = session.engine.model, session.engine
    with session.intervening.hooks.suspended(), torch.no_grad():
        ids = runner.encode(source)
        value = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER + 1][0, 2]

    def replace(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[:, 2] = value
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    check_steps(session, lambda: [decoder_layers(model)[LAYER].register_forward_hook(replace)])
    assert any(r.unsteered.kl > 0 for r in session.records)  # it did change the model's view


def test_a_patch_past_the_source_or_misspelt_is_one_line():
    session = Session(ModelRunner(family_model("llama")))
    with pytest.raises(SettingsError, match=r"has positions 0-\d+: no position 40"):
        session.set_interventions([Patch(1, 40, "short")])
    with pytest.raises(SettingsError, match="LAYER:POSITION:TEXT"):
        parse_patch("1:x:text")
    assert parse_patch("2:3:a:b") == Patch(2, 3, "a:b")


def test_a_journey_saves_its_interventions_and_unsteered_views_and_verifies_with_them(tmp_path):
    import json

    from tokenviz.files.journey_file import open_journey, recording_of, save_journey
    from tokenviz.journey.reproduce import verify_journey
    from tokenviz.worker.snapshots import snapshot_of

    session = journey("llama", [HeadAblation(LAYER, HEAD, mean=True), Patch(LAYER, 1, "A dog ran")], steps=3)
    session.rewind(1)
    session.set_interventions([Steering(LAYER, 3.0, "cats", "dogs")])  # another set for the last steps
    session.step()
    session.step()
    path = save_journey(tmp_path / "j.json", snapshot_of(session))
    doc = json.loads(path.read_text())
    assert len(doc["replay"]["intervention_sets"]) == 2  # each set once, however many steps name it
    recording = recording_of(open_journey(path))
    assert [r.interventions for r in recording.snapshot.records] == [r.interventions for r in session.records]
    assert [r.unsteered for r in recording.snapshot.records] == [r.unsteered for r in session.records]
    assert recording.snapshot.interventions == ((Steering(LAYER, 3.0, "cats", "dogs"), True),)  # the status line's
    fresh = Session(ModelRunner(family_model("llama")))
    assert verify_journey(doc, fresh) == (len(session.generated_ids), None)
    doc["replay"]["records"][1]["interventions"] = 5
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenvizError, match="names intervention set 5"):
        open_journey(path)


def test_a_branch_made_before_an_intervention_is_shown_as_the_model_now_is():
    session = journey("llama", [], steps=8)
    session.rewind(3)  # (the whole path is kept as a branch)
    session.step(forced_id=session.pending.top[1].id)
    session.step()
    unfinished = list(session.ids)  # a path of its own, still pending
    session.take_rank(3, steps_back=2)  # (it is kept as a branch)
    session.set_interventions([HeadAblation(LAYER, HEAD)])
    index = next(i for i, path in enumerate(session.branches.paths) if list(path.ids) == unfinished)
    session.switch_branch(index)
    assert session.ids == unfinished and session.pending.interventions == (HeadAblation(LAYER, HEAD),)
    assert session.pending.unsteered is not None
    model = session.engine.model
    with session.intervening.hooks.suspended():
        handle = reference_ablation(model, "llama")
        try:
            check_steps_against_pending(session, model)
        finally:
            handle.remove()


def test_the_lens_shows_the_intervened_model_and_forgets_what_it_showed_before():
    session = journey("llama", [], steps=6)
    session.rewind(2)
    position = len(session.ids) - 1
    earlier = session.analyses.inspect(position - 1)  # its next token is committed: the same key after
    before = session.analyses.inspect(position)
    session.set_interventions([Steering(LAYER, 4.0, "cats", "dogs")])
    after = session.analyses.inspect(position)
    again = session.analyses.inspect(position - 1)
    assert again.lens[-1] != earlier.lens[-1]  # computed again, of the model as it now is
    rows = [[(row.top, row.residual_norm) for row in inspection.lens] for inspection in (after, before)]
    assert rows[0][: LAYER + 1] == rows[1][: LAYER + 1]  # the embeddings and the layers before it
    assert all(a != b for a, b in zip(rows[0][LAYER + 1 :], rows[1][LAYER + 1 :]))
    last, top = after.lens[-1], session.pending.top  # the lens's last layer is the intervened output
    assert [i for i, _, _ in last.top] == [c.id for c in top[: len(last.top)]]
    assert [p for _, _, p in last.top] == pytest.approx([c.prob for c in top[: len(last.top)]], abs=1e-5)


def test_a_patch_from_another_branch_takes_that_paths_residual_and_keeps_its_tokens():
    session = journey("llama", [], steps=6)
    n = len(session.prompt_ids)
    session.rewind(3)  # the whole path is kept: branch 1
    other = list(session.branches.paths[0].ids)
    session.step(forced_id=session.pending.top[1].id)  # this path parts from it at position n + 3
    session.step()
    at = n + 3
    assert session.ids[at] != other[at]
    session.set_interventions([Patch(LAYER, at, "branch 1")])
    (patch,) = session.interventions
    assert patch.source_ids == tuple(other)  # the branch's tokens, whatever the branches do later
    model = session.engine.model
    with session.intervening.hooks.suspended():
        with torch.no_grad():
            value = model(torch.tensor([other]), output_hidden_states=True).hidden_states[LAYER + 1][0, at]

        def replace(module, args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            hidden[:, at] = value
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = decoder_layers(model)[LAYER].register_forward_hook(replace)
        try:
            check_steps_against_pending(session, model)
        finally:
            handle.remove()
    assert session.pending.unsteered.kl > 0
    with pytest.raises(TokenvizError, match="no branch 7"):
        session.set_interventions([Patch(LAYER, at, "branch 7")])


def tiny_deepseek_v3():
    """Multi-head latent attention (MLA): the output projection takes heads × v_head_dim (4 × 6), not
    the hidden size; not in the family matrix, so built here."""
    from families import model_of
    from transformers import AutoConfig

    eos = family_config("llama").eos_token_id
    mla = dict(kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6)
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1)
    config = AutoConfig.for_model(
        "deepseek_v3",
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=128,
        eos_token_id=eos,
        bos_token_id=eos,
        pad_token_id=eos,
        **mla,
        **experts,
    )
    return model_of(config, "tiny-deepseek_v3")


def test_interventions_on_multi_head_latent_attention_equal_plain_hooks():
    loaded = tiny_deepseek_v3()
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=STEPS))
    _, prompt, _ = tokenize(session.engine, PROMPT)
    steering = Steering(LAYER, 3.0, "cats", "dogs")
    session.set_interventions([HeadAblation(LAYER, HEAD), steering, Patch(LAYER, 1, "A dog ran")], context=prompt)
    session.start(PROMPT)
    while session.step() is not None:
        pass
    model = loaded.model
    with session.intervening.hooks.suspended(), torch.no_grad():
        states = [
            model(torch.tensor([loaded.tokenizer(t)["input_ids"]]), output_hidden_states=True).hidden_states
            for t in ("cats", "dogs", "A dog ran")
        ]
    vector = 3.0 * (states[0][LAYER + 1][0, -1] - states[1][LAYER + 1][0, -1])
    patched = states[2][LAYER + 1][0, 1]

    def steer_and_patch(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden + vector
        if hidden.shape[1] > 1:
            hidden[:, 1] = patched
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    check_steps(
        session,
        lambda: [
            reference_ablation(model, "deepseek_v3"),
            decoder_layers(model)[LAYER].register_forward_hook(steer_and_patch),
        ],
    )


def test_the_attention_map_and_the_logit_split_show_the_intervened_model():
    session = journey("llama", [], steps=6)
    session.rewind(1)
    session.set_interventions([HeadAblation(LAYER, HEAD), Steering(LAYER, 2.0, "cats", "dogs")])
    model, ids = session.engine.model, session.cached_ids
    rows = range(len(ids) - 3, len(ids))
    mine = session.attention(rows, [LAYER + 1])[0]
    top = session.pending.top
    session.pin([top[0].id, top[1].id])
    split = session.analyses.logit_difference(len(ids) - 1)
    with session.intervening.hooks.suspended():
        with torch.no_grad():
            direction = [
                model(torch.tensor([session.engine.encode(t)]), output_hidden_states=True).hidden_states[LAYER + 1][
                    0, -1
                ]
                for t in ("cats", "dogs")
            ]
        handles = [reference_ablation(model, "llama"), reference_steering(model, 2.0 * (direction[0] - direction[1]))]
        try:
            out = eager_forward(model, ids)
        finally:
            for handle in handles:
                handle.remove()
    expected = out.attentions[LAYER + 1][0][:, rows.start : rows.stop].numpy()
    assert abs(mine[:, :, : rows.stop] - expected[:, :, : rows.stop]).max() < 1e-5
    logits = out.logits[0, -1]
    assert split.total == pytest.approx(float(logits[top[0].id] - logits[top[1].id]), abs=1e-4)
    assert split.shares == pytest.approx(split.total, abs=1e-4)
