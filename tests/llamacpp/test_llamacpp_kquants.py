"""The bundled model requantized by llama.cpp's own quantizer (llama_model_quantize, as llama-quantize
does) to the K-quants people download, held to llama-cpp-python's own Llama and to the steps themselves.

On these files llama.cpp's numbers depend on a pass's shape (its kernels and flash attention split the
work by it): the lens, read from one pass over the whole journey, showed another top-1 than the step it
sat beside (Q4_K_M, step 0: " Paris" 0.351 beside the step's 0.419), and verify, a recompute in one
batch, was off by as much. Views now feed the journey's passes as they were fed (Runtime.shaped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_reference import greedy_session, own_llama, requantized, same_logits_as, trace

from tokenviz.contract.engine import LensAsk

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

QUANTS = ("Q4_K_M", "Q6_K")
# Two float32 softmaxes of the same logits (the lens's last row is the pass's own logits): equal but for
# the order of a sum.
SAME_DISTRIBUTION = 1e-6


@pytest.fixture(scope="module")
def kquant_files(llama_cpp, tmp_path_factory) -> dict[str, Path]:
    from tokenviz.system.paths import bundled_gguf

    folder = tmp_path_factory.mktemp("kquants")
    return {kind: requantized(bundled_gguf(), folder / f"smollm2-{kind}.gguf", kind) for kind in QUANTS}


@pytest.mark.parametrize("kind", QUANTS)
def test_every_steps_lens_ends_on_the_steps_own_distribution(monkeypatch, capsys, kquant_files, kind):
    """trace --lens: the tokens and logits are llama-cpp-python's own step by step, and at every step the
    lens's last layer is the step's distribution."""
    doc = trace(monkeypatch, capsys, "--steps", "8", "--temperature", "0", "--lens", model=kquant_files[kind])
    for reference in own_llama(path=kquant_files[kind]):
        same_logits_as(reference, doc)
    for step in doc["steps"]:
        last, own = step["lens"][-1]["top"], step["top"][: len(step["lens"][-1]["top"])]
        assert [entry["id"] for entry in last] == [entry["id"] for entry in own], step["index"]
        assert np.allclose([e["prob"] for e in last], [e["prob"] for e in own], rtol=0, atol=SAME_DISTRIBUTION)


@pytest.mark.parametrize("kind", QUANTS)
def test_the_lens_and_verify_after_a_rewind_are_the_journeys_own(kquant_files, kind):
    """A journey stepped, rewound and stepped again (its cache in passes of several shapes): the lens at the
    pending step and at a past one end on those steps' distributions, and verify's recompute equals the
    cache."""
    from tokenviz.journey.verification import verify_latest

    session = greedy_session(4, str(kquant_files[kind]))
    session.rewind(2)
    session.step()
    session.step()
    engine, ids = session.engine, list(session.cached_ids)
    for record in (session.records[-1], session.records[-3]):
        position = record.position - 1
        ask = LensAsk(tuple(ids[: position + 1]), (position,), (record.decision.chosen_id,), (), None)
        found = engine.inspect(ask)[0]
        last = found.lens[-1].top
        assert [t[0] for t in last] == [c.id for c in record.top[: len(last)]], position
        assert np.allclose([t[2] for t in last], [c.prob for c in record.top[: len(last)]], atol=SAME_DISTRIBUTION)
    verified = verify_latest(engine, list(engine.fed))
    assert verified.argmax_agrees and verified.max_logit_diff < SAME_DISTRIBUTION, verified
    assert "in passes of the journey's own shapes" in verified.compared_with  # (what the cache view says)
