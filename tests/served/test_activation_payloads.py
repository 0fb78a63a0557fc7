"""What tokenviz does with a served model's activations (tokenviz.backends.served.activations) and their replay into
attention weights (tokenviz.backends.served.internals.replay), without a server: every lie one line."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
import zstandard

from tokenviz.backends.served.activations import QkMeta, qk_meta, tensor, tensor_entry
from tokenviz.backends.served.internals import replay
from tokenviz.backends.shared.endpoint import EndpointError


def test_a_tensor_goes_and_comes_back_and_bfloat16_and_float16_are_read_as_float32():
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    back = tensor({"x": tensor_entry(values)}, "x", (2, None, 4), "h")
    assert back.dtype == np.float32 and np.array_equal(back, values)
    bits = torch.from_numpy(values).to(torch.bfloat16)
    entry = tensor_entry(values) | {"dtype": "int16", "original_dtype": "torch.bfloat16"}
    entry["data"] = base64.b64encode(
        zstandard.ZstdCompressor().compress(bits.view(torch.int16).numpy().tobytes())
    ).decode()
    assert np.array_equal(tensor({"x": entry}, "x", (2, 3, 4), "h"), bits.float().numpy())
    half = values.astype("<f2")
    entry = tensor_entry(values) | {"dtype": "float16", "original_dtype": "torch.float16"}
    entry["data"] = base64.b64encode(zstandard.ZstdCompressor().compress(half.tobytes())).decode()
    assert np.allclose(tensor({"x": entry}, "x", (2, 3, 4), "h"), values, atol=1e-3)


def _entry(**change):
    return {"x": tensor_entry(np.ones((2, 3), dtype=np.float32)) | change}


@pytest.mark.parametrize(
    ("activations", "said"),
    [
        ({}, "did not send x"),
        ({"x": {"__type__": "cloudpickle", "data": "gASV"}}, "in a form tokenviz does not read"),
        (_entry(handle="h1"), "in a form tokenviz does not read"),
        (_entry(dtype="object"), "not a float tensor"),
        (_entry(dtype="int16"), "not a float tensor"),  # (int16 is read only as bfloat16's bits)
        (_entry(compression="lz4"), "compressed as 'lz4'"),
        (_entry(shape=[2, 4]), "of shape [2, 4], where the model's is 2×3"),
        (_entry(shape=[2, 3.0]), "where the model's is 2×3"),
        (_entry(shape=[2, -3]), "where the model's is 2×3"),
        (_entry(data="not base64!"), "not base64"),
        (_entry(data=base64.b64encode(b"plain bytes").decode()), "not a zstd frame"),
        (_entry(data=base64.b64encode(zstandard.ZstdCompressor().compress(b"\0" * 10**7)).decode()), "shape says"),
        (_entry(data=base64.b64encode(zstandard.ZstdCompressor().compress(b"\0" * 8)).decode()), "shape says"),
        (_entry(data="A" * 10**6), "larger than its shape allows"),
        ({"x": tensor_entry(np.array([[1, np.nan, 3], [0, 0, 0]], dtype=np.float32))}, "not finite"),
    ],
)
def test_a_payload_that_lies_is_one_line(activations, said):
    with pytest.raises(EndpointError, match=r"^h ") as caught:
        tensor(activations, "x", (2, 3), "h")
    assert said in str(caught.value)


def test_a_shape_past_the_bound_is_refused_before_anything_is_decoded():
    entry = {"x": {"data": "", "dtype": "float32", "shape": [1 << 20, 1 << 20], "compression": "zstd"}}
    with pytest.raises(EndpointError, match="over the"):
        tensor(entry, "x", (None, None), "h")


def test_qk_meta_is_read_only_as_plain_json_with_a_number_per_head():
    meta = {"scale": 0.125, "logits_soft_cap": 0.0, "sliding_window": [-1, -1], "alibi_slopes": None, "sinks": None}
    good = {"qk_layers": {"__json__": [3]}, "qk_meta": {"__json__": [meta]}}
    assert qk_meta(good, [3], 9, "h") == [QkMeta(0.125, 0.0, (-1, -1), None, None)]
    for lie in (
        {"qk_layers": {"__json__": [4]}},
        {"qk_meta": {"__type__": "cloudpickle", "data": "x"}},
        {"qk_meta": {"__json__": [meta | {"scale": "1e400"}]}},
        {"qk_meta": {"__json__": [meta | {"sinks": [0.0] * 8}]}},
        {"qk_meta": {"__json__": [meta | {"sliding_window": [4]}]}},
        {"qk_meta": {"__json__": [meta | {"use_alibi_sqrt": True}]}},
    ):
        with pytest.raises(EndpointError):
            qk_meta(good | lie, [3], 9, "h")


def test_the_replay_is_scaled_causal_windowed_capped_and_sunk_as_the_kernel_is():
    torch.manual_seed(0)
    q, k = torch.randn(5, 4, 8), torch.randn(5, 2, 8)
    plain = replay(q, k, QkMeta(0.3, 0.0, (-1, -1), None, None), 0)
    grouped = k.repeat_interleave(2, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, grouped) * 0.3
    expected = torch.softmax(logits.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")), -1)
    assert (plain - expected).abs().max() < 1e-6
    rows = replay(q[3:], k, QkMeta(0.3, 0.0, (-1, -1), None, None), 3)  # queries from position 3
    assert (rows - plain[:, 3:]).abs().max() < 1e-6
    window = replay(q, k, QkMeta(0.3, 0.0, (1, 0), None, None), 0)  # each query sees itself and one before
    assert window[:, 4, :3].abs().max() == 0 and (window[:, 4, 3:].sum(-1) - 1).abs().max() < 1e-6
    capped = replay(q, k, QkMeta(0.3, 0.5, (-1, -1), None, None), 0)
    assert (capped - plain).abs().max() > 1e-3
    sunk = replay(q, k, QkMeta(0.3, 0.0, (-1, -1), None, (0.0, 1.0, 2.0, 3.0)), 0)
    assert (sunk.sum(-1) < 1).all() and torch.all(sunk.sum(-1)[3] < sunk.sum(-1)[0])


@pytest.mark.parametrize(
    "lie, said",
    [
        ({"scale": 1e308}, "scale of 1e+308"),
        ({"alibi_slopes": [-1e308] * 9}, "ALiBi slope of -1e+308"),
        ({"sinks": [1e300] * 9}, "sink of 1e+300"),
        ({"logits_soft_cap": 1e300}, "soft-cap of 1e+300"),
    ],
    ids=["scale", "alibi", "sinks", "soft-cap"],
)
def test_an_attention_number_no_model_has_blames_the_server_not_the_weights(lie, said):
    """(Round 6, finding 16: a scale of 1e308 or ALiBi slopes of -1e308 asked whether the model's
    weights were damaged.)"""
    meta = {"scale": 0.125, "logits_soft_cap": 0.0, "sliding_window": [-1, -1], "alibi_slopes": None, "sinks": None}
    answer = {"qk_layers": {"__json__": [3]}, "qk_meta": {"__json__": [meta | lie]}}
    with pytest.raises(EndpointError) as caught:
        qk_meta(answer, [3], 9, "h")
    assert said in str(caught.value) and "the server's answer is wrong" in str(caught.value)
    assert "weights" not in str(caught.value)


def test_a_capture_is_bounded_by_what_it_asks_and_refused_past_its_budget_in_one_line():
    """(Round 6, finding 2.) An 8B shape (32 layers of 4,096) captured whole: 2,000 positions in float32 pass
    the budget (one line: the size, and what to do), in bfloat16 (the probe saw it) they fit; a step
    over the budget asks for no stream (the lens then says why)."""
    from types import SimpleNamespace

    from tokenviz.backends.served.internals import CAPTURE_BUDGET_BYTES, Plugin, ServedInternals
    from tokenviz.backends.shared.endpoint import Endpoint
    from tokenviz.contract.errors import TokenvizError

    config = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    head = SimpleNamespace(config=config, layers=32, hidden=4096)
    everything = {"output_residual_stream": list(range(32))}
    wide = ServedInternals(Endpoint("http://127.0.0.1:1/v1"), "m", head, Plugin(True, True, 4))
    narrow = ServedInternals(Endpoint("http://127.0.0.1:1/v1"), "m", head, Plugin(True, True, 2))
    raw = 32 * 2000 * 4096 * 4
    assert raw < wide.capture_bytes(everything, 2000) < raw * 1.4  # (as sent: zstd's worst case, base64)
    with pytest.raises(TokenvizError) as refused:
        wide.checked_capture(everything, 2000)
    line = str(refused.value)
    assert "for 32 layers at 2,000 positions" in line and "show fewer lens layers (--lens-layers " in line
    assert f"{CAPTURE_BUDGET_BYTES / 1e6:,.0f} MB" in line and "\n" not in line
    assert narrow.checked_capture(everything, 2000) == narrow.capture_bytes(everything, 2000)
    assert wide.checked_capture(everything, 1000) == wide.capture_bytes(everything, 1000)
    wide.wanted = True
    assert wide.step_xargs(2000) == ({}, 0) and wide.captured is None
    narrow.wanted = True
    assert narrow.step_xargs(2000) == (everything, narrow.capture_bytes(everything, 2000))
    wide.asked, wide.wanted = (0, 8, 16, 24, 31), True  # (the lens asked for these layers: a step captures them)
    fewer = {"output_residual_stream": [0, 8, 16, 24, 31]}
    assert wide.step_xargs(2000) == (fewer, wide.capture_bytes(fewer, 2000))
