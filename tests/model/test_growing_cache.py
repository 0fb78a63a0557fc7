"""The journey's KV cache grows in place (GrowingLayer): a step writes its position into room kept
past the filled ones instead of copying the whole cache, and nothing that reads or cuts the cache
sees a difference from transformers' own DynamicLayer."""

import torch
from transformers import DynamicCache

from tokenviz.backends.transformers.cache import GrowingLayer, cut_view, with_cache
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session


def filled(layer, positions: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(1, 2, positions, 4, generator=generator) for _ in range(2))
    layer.update(keys, values)
    return keys, values


def test_a_journeys_steps_write_in_place_and_hold_what_a_dynamic_cache_holds(tiny):
    session = Session(ModelRunner(tiny), SamplingSettings(temperature=0))
    session.start("The Eiffel Tower is located in the city of")
    layers = session.engine.cache.layers
    assert all(isinstance(layer, GrowingLayer) for layer in layers)
    storage = [layer.keys.untyped_storage().data_ptr() for layer in layers]
    for _ in range(5):
        session.step()
    assert [layer.keys.untyped_storage().data_ptr() for layer in layers] == storage  # nothing copied

    plain = DynamicCache()  # the whole path again, in one pass, through transformers' own cache
    fed = session.ids[: session.engine.kv_len]
    with torch.inference_mode():
        tiny.model(input_ids=torch.tensor([fed], device=session.engine.device), **with_cache(tiny.model, plain))
    for mine, theirs in zip(layers, plain.layers):
        assert mine.keys.shape == theirs.keys.shape
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-5, atol=1e-6)


def test_a_pass_over_a_cut_view_leaves_the_positions_past_the_cut_as_they_were():
    layer = GrowingLayer()
    keys, values = filled(layer, 6)
    cut = cut_view(layer, 3)
    new_keys, new_values = torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4)
    out_keys, out_values = cut.update(new_keys, new_values)
    assert torch.equal(out_keys, torch.cat([keys[:, :, :3], new_keys], 2))
    assert torch.equal(out_values, torch.cat([values[:, :, :3], new_values], 2))
    assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)  # the journey's own, untouched
    layer.update(new_keys, new_values)  # and the layer goes on from its own end
    assert torch.equal(layer.keys, torch.cat([keys, new_keys], 2))


def test_tensors_set_from_outside_are_copied_before_a_write_never_written_into():
    """As the compiled step sets its static buffers' views as a layer's keys and values."""
    layer = GrowingLayer()
    filled(layer, 2)
    static = torch.randn(1, 2, 16, 4), torch.randn(1, 2, 16, 4)
    untouched = static[0].clone(), static[1].clone()
    layer.keys, layer.values = static[0][:, :, :5], static[1][:, :, :5]
    assert layer.get_seq_length() == 5
    layer.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert torch.equal(static[0], untouched[0]) and torch.equal(static[1], untouched[1])
    assert torch.equal(layer.keys[:, :, :5], static[0][:, :, :5]) and not layer.keys[:, :, 5].any()
    layer.keys, layer.values = static[0][:, :, :4], static[1][:, :, :4]
    layer.crop(-1)  # a crop of tensors from outside cuts the view, as a DynamicLayer's does
    layer.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert torch.equal(static[0], untouched[0]) and layer.get_seq_length() == 4
    layer.take(static[0][:, :, :6], static[1][:, :, :6])  # held: cropped within them, then a write
    layer.crop(-3)
    layer.update(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    assert torch.equal(static[0], untouched[0]) and torch.equal(static[1], untouched[1])
    assert torch.equal(layer.keys[:, :, :3], static[0][:, :, :3]) and layer.get_seq_length() == 5


def test_a_crop_then_a_step_overwrites_the_dropped_positions_in_place():
    layer = GrowingLayer()
    keys, _ = filled(layer, 5)
    storage = layer.keys.untyped_storage().data_ptr()
    layer.crop(-2)
    assert layer.get_seq_length() == 3 and torch.equal(layer.keys, keys[:, :, :3])
    layer.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert layer.keys.untyped_storage().data_ptr() == storage
    assert torch.equal(layer.keys, torch.cat([keys[:, :, :3], torch.ones(1, 2, 1, 4)], 2))
