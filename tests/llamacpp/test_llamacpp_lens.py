"""The lens of a GGUF in llama.cpp costs what the screen shows: its head is llama.cpp's own (ggml's kernels on
the file's quantized head, the same logits bit for bit as llama-cpp-python's own, outside tokenviz), and
while it is in use a step reads its rows in the step's own pass (no pass of its own), with every step's
logits what they are without it, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llama_reference import PROMPT, THREADS, offloaded

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]


def opened():
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings

    opening = Opening("trace", offloaded(), frozenset(), None, SamplingSettings(temperature=0))
    return BACKEND.loader(opening)(lambda message, fraction: None)


def session_on(engine):
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    session = Session(engine, SamplingSettings(temperature=0))
    session.start(PROMPT)
    return session


def test_the_lens_head_gives_llama_cpps_own_logits(reference):
    """The last layer's residual through the lens's head is llama-cpp-python's own logits at that position
    (measured bit for bit here; held within 1e-5), and the float head kept for a ggml without its CPU graph
    is within the lens's check of its distribution."""
    from tokenviz.backends.llamacpp.ggml_head import FloatHead, Head
    from tokenviz.backends.llamacpp.internals import LENS_CHECK

    engine = opened()
    internals = engine.internals
    ids = engine.encode(PROMPT)
    last = f"l_out-{engine.info.layers - 1}"
    position = len(ids) - 1
    residual = internals._pass(internals.lens_context, ids, position, [position], {last}).at(last, [position])
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    assert prompt == ids
    reference.reset()
    reference.eval(prompt)
    theirs = torch.from_numpy(np.asarray(reference.scores[len(prompt) - 1], dtype=np.float32).copy())
    ours = internals.head.logits(residual)[0]
    assert (ours - theirs).abs().max() <= 1e-5
    floated = Head(engine.path, "llama", internals.eps, THREADS, ggml_graphs=False)
    assert isinstance(floated.apply, FloatHead)
    difference = torch.softmax(floated.logits(residual)[0], -1) - torch.softmax(theirs, -1)
    assert difference.abs().max() <= LENS_CHECK


def test_the_lens_head_is_the_files_own_pages_and_a_copy_where_they_are_misaligned():
    """The head's matrix is read where the GGUF is mapped (no copy of a head of hundreds of megabytes is
    held); a tensor lying off ggml's alignment is copied to an aligned address, with the same logits bit for
    bit."""
    from types import SimpleNamespace

    from tokenviz.backends.llamacpp.ggml import ALIGNMENT, graphs
    from tokenviz.backends.llamacpp.ggml_head import GgmlHead

    head = opened().internals.head
    assert isinstance(head.apply, GgmlHead) and isinstance(head.apply.raw, np.memmap)
    data = head.matrix.data
    misaligned = np.empty(data.nbytes + 1, dtype=np.uint8)[1:].view(data.dtype).reshape(data.shape)
    misaligned[...] = data
    moved = SimpleNamespace(name=head.matrix.name, shape=head.matrix.shape, tensor_type=head.matrix.tensor_type)
    copied = GgmlHead(graphs(), head.norm.numpy(), head.eps, SimpleNamespace(**vars(moved), data=misaligned), 2)
    assert misaligned.ctypes.data % ALIGNMENT and copied.raw.ctypes.data % ALIGNMENT == 0
    residual = torch.randn(3, head.apply.hidden, generator=torch.Generator().manual_seed(0))
    assert torch.equal(copied.logits(residual), head.logits(residual))


def test_a_lens_in_use_is_read_in_the_steps_own_pass_and_changes_no_logit():
    """Stepping with the lens asked at each step (as the app's lens view asks it) gives every step's logits
    bit for bit as stepping without; after the first two steps the lens's own context feeds nothing (the
    step's pass read the rows), and what it shows is what the lens's own context gives with its cache
    emptied: the journey's cells copied, the step's pass fed again as it was (one token), equal within
    1e-6. Once the lens is closed, the journey's context carries no callback again."""
    from tokenviz.backends.shared.lens_in_use import IN_USE_STEPS
    from tokenviz.contract.results import LensAsk

    engine = opened()
    lensed, plain = session_on(engine), session_on(engine.twin())
    context = engine.internals.lens_context
    fed: list[int] = []
    decode = context.decode
    context.decode = lambda tokens, start, *a, **k: fed.append(len(tokens)) or decode(tokens, start, *a, **k)
    rows = (0, 7, 14, 21, engine.info.layers)
    for _ in range(5):
        lensed.step()
        plain.step()
        shown = lensed.analyses.inspect(len(lensed.ids) - 2, rows)
        assert torch.equal(lensed.pending_logits, plain.pending_logits)
    # (the first lens, at the prompt's last position: the prompt's pass again; the second, the step's
    # pass again, before the journey's context had the callback)
    assert fed == [len(lensed.prompt_ids), 1], fed
    assert engine.runtime.capture is not None
    position = len(lensed.ids) - 2
    context.clear()
    engine.internals.steps.clear()  # (the steps' captures forgotten: a pass of the lens's own)
    ask = LensAsk(tuple(lensed.ids[: position + 1]), (position,), (lensed.ids[position + 1],), (), rows)
    again = engine.inspect(ask)[0]
    assert fed[-1] == 1  # (the cells before the step's pass copied from the journey's context)
    for layer_shown, layer_again in zip(shown.lens, again.lens, strict=True):
        assert layer_shown.layer == layer_again.layer
        assert [t[0] for t in layer_shown.top[:3]] == [t[0] for t in layer_again.top[:3]]
        assert [t[2] for t in layer_shown.top] == pytest.approx([t[2] for t in layer_again.top], abs=1e-6)
        assert layer_shown.chosen_prob == pytest.approx(layer_again.chosen_prob, abs=1e-6)
    for _ in range(IN_USE_STEPS + 1):
        lensed.step()
        plain.step()
        assert torch.equal(lensed.pending_logits, plain.pending_logits)
    assert engine.runtime.capture is None and engine.kv_len == len(lensed.ids)


def test_reopening_a_context_keeps_its_cache_bit_for_bit():
    """A context opened again (with a callback, then without) keeps the cells it held, copied: the next
    step's logits are those of a context never reopened, bit for bit."""
    from tokenviz.backends.llamacpp.capture import Capture

    runtime = opened().runtime
    other = runtime.sibling()
    ids = other.tokenize(PROMPT, True)
    for context in (runtime, other):
        context.decode(ids, 0)
    runtime.reopen(Capture(runtime.lib.ggml_backend_sched_eval_callback))
    assert runtime.capture is not None and runtime.held == ids
    token = 1000
    for reopened_with in ("capture", None):
        ours, theirs = runtime.decode([token], len(runtime.held)), other.decode([token], len(other.held))
        assert np.array_equal(ours, theirs)
        if reopened_with == "capture":
            runtime.reopen(None)
            assert runtime.capture is None
