"""The logit difference of two tokens split by layer (direct logit attribution) is the model's own:
on every family the engine supports, with biased norms and a soft cap that bites, the shares add up
to the difference of the model's logits; each MLP share is what its branch added to the residual
stream; the bundled model agrees too."""

import pytest
import torch
from families import FAMILIES, family_model
from stock import saved, stock_forward

from tokenviz.backends.shared.output_head import final_norm
from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.logit_difference import _mlp_branch_end, logit_difference, residual_parts
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.journey.session import Session

TEXT = "The Eiffel Tower is located in Paris, France"
A, B = 42, 77


def shaken(kind: str):
    """A tiny model whose norms have gains and biases far from 1 and 0 (random init leaves them
    plain, which would hide a bias share or a gain applied twice), an output bias where the family
    has one, and for Gemma 2 a soft cap small enough to bend its logits."""
    loaded = family_model(kind)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if "norm" in name or "ln" in name.split(".")[-2]:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
        head_bias = getattr(loaded.model.get_output_embeddings(), "bias", None)
        if head_bias is not None:
            head_bias.add_(torch.randn(head_bias.shape, generator=generator))
    if kind == "gemma2":
        loaded.model.config.final_logit_softcapping = 0.5
    return loaded


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_the_shares_add_up_to_the_models_own_logit_difference(kind):
    loaded = shaken(kind)
    runner = ModelRunner(loaded)
    ids = runner.encode(TEXT)[:12]
    split = logit_difference(runner, ids, A, B)
    logits = stock_forward(saved(loaded.model), ids).logits[0, -1].double()
    assert split.total == pytest.approx(float(logits[A] - logits[B]), abs=1e-4)
    assert split.shares == pytest.approx(split.total, abs=1e-4)
    assert len(split.attention) == len(split.mlp) == loaded.info.layers
    if kind == "gemma2":
        assert abs(split.softcap) > 1e-3  # the cap bent this difference, and its share says by how much
    else:
        assert split.softcap == 0.0


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_each_mlp_share_is_what_its_branch_added_to_the_residual_stream(kind):
    """Take the last layer's measured MLP output back out of its branch: the final norm's input drops
    by exactly that vector. (Were the wrong module hooked, or a post-norm or a residual inside the MLP
    missed, it would not.)"""
    loaded = shaken(kind)
    runner = ModelRunner(loaded)
    ids = runner.encode(TEXT)[:12]
    stream, mlp, _, _ = residual_parts(runner, ids)
    branch = _mlp_branch_end(decoder_layers(loaded.model)[-1])
    seen = []

    def take_out(module, args, output):
        tensor = output[0] if isinstance(output, tuple) else output
        flat = tensor.reshape(-1, tensor.shape[-1]).clone()
        flat[-1] -= mlp[-1]
        out = flat.reshape(tensor.shape)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    handles = [
        branch.register_forward_hook(take_out),
        final_norm(loaded.model).register_forward_hook(
            lambda m, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1])[-1])
        ),
    ]
    try:
        with torch.inference_mode():
            loaded.model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(seen[-1], stream[-1] - mlp[-1], atol=1e-5)
    assert mlp[-1].abs().max() > 1e-3  # (something was taken out)


def test_the_bundled_model_splits_paris_against_london(bundled):
    runner = ModelRunner(bundled)
    ids = runner.encode("The Eiffel Tower is located in the city of")
    paris, london = runner.encode(" Paris")[0], runner.encode(" London")[0]
    split = logit_difference(runner, ids, paris, london)
    with torch.inference_mode():
        logits = bundled.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
    assert split.total == pytest.approx(float(logits[paris] - logits[london]), abs=1e-4)
    assert split.shares == pytest.approx(split.total, abs=1e-4)
    assert split.total > 0  # the model prefers Paris


def test_the_session_splits_the_first_two_watched_tokens_and_keeps_them_on_its_path(tiny_llama):
    session = Session(ModelRunner(tiny_llama))
    session.start(TEXT)
    session.step()
    with pytest.raises(TokenvizError, match="watch two tokens"):
        session.analyses.logit_difference(3)
    session.watch(A)
    session.watch("id:77")
    split = session.analyses.logit_difference(3)
    assert (split.a_id, split.b_id, split.position) == (A, B, 3)
    assert session.analyses.kept().logit_differences == (split,)
    session.rewind(1)
    session.start("Another prompt altogether")
    assert session.analyses.kept().logit_differences == ()  # not on this path
