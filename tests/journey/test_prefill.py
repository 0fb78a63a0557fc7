"""The prefill, chunk by chunk: the same numbers as one forward pass, progress, cancelling that
leaves the journey as it was, and what the model predicted at every prompt position."""

import dataclasses
import gc
import pickle
import types

import pytest
import torch
from closeness import assert_close

from tokenviz.backends.transformers.head_check import head_reproduces, settle_head
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import Cancelled
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding import prompt_predictions
from tokenviz.journey import memory_policy
from tokenviz.journey.session import Session

PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


@pytest.fixture
def small_chunks(monkeypatch):
    """A headless run's prefill in passes of 4 tokens (its session is made inside it)."""
    monkeypatch.setattr(memory_policy, "PROMPT_CHUNK", 4)


def started(loaded, chunk: int = 10_000, **kwargs) -> Session:
    s = Session(ModelRunner(loaded), SamplingSettings(seed=4), prefill_chunk=chunk)
    s.start(PROMPT, **kwargs)
    return s


def test_a_chunked_prefill_equals_one_forward_pass(tiny):
    done = []
    chunked = started(tiny, 4, progress=lambda n, total: done.append((n, total)))
    n = len(chunked.prompt_ids)
    ends = [(min(k, n), n) for k in range(4, n + 4, 4)]
    assert [d for d in done if d in ends] == ends and done == sorted(done)  # each pass's end, in order
    for end in range(4, n, 4):  # and within each whole pass, between its layers
        assert any(end - 4 < k < end for k, _ in done)
    whole = started(tiny)
    a, b = chunked.records[0], whole.records[0]
    layers = range(tiny.info.layers)
    assert abs(chunked.attention(range(n), layers) - whole.attention(range(n), layers)).max() < 1e-5
    assert [c.id for c in a.top] == [c.id for c in b.top]
    assert [c.logit for c in a.top] == pytest.approx([c.logit for c in b.top], abs=1e-4)
    assert a.decision.chosen_id == b.decision.chosen_id  # the same draw on (nearly) the same numbers
    assert a.decision.raw_probs == pytest.approx(b.decision.raw_probs, abs=1e-5)
    for x, y in zip(a.prompt_predictions, b.prompt_predictions, strict=True):
        assert (x.next_rank, [c.id for c in x.top]) == (y.next_rank, [c.id for c in y.top])
        assert x.next_prob == pytest.approx(y.next_prob, abs=1e-5)
    chunked.step()
    whole.step()
    assert chunked.ids == whole.ids


@pytest.mark.parametrize("slice_rows", [None, 3])
def test_every_prompt_position_has_the_models_prediction(tiny, slice_rows, monkeypatch):
    if slice_rows:  # worked through a few rows at a time, as a large vocabulary is
        for name in ("SLICE_NUMBERS", "CPU_SLICE_NUMBERS"):
            monkeypatch.setattr(prompt_predictions, name, slice_rows * tiny.info.vocab)
    s = started(tiny)
    ids = s.prompt_ids
    with torch.inference_mode():
        probs = torch.softmax(s.engine.model(torch.tensor([ids], device=tiny.model.device)).logits[0].float(), -1)
    predictions = s.records[0].prompt_predictions
    assert [p.position for p in predictions] == list(range(len(ids) - 1))
    for p in predictions:
        row = probs[p.position]
        assert p.next_id == ids[p.position + 1]
        assert p.next_prob == pytest.approx(float(row[p.next_id]), abs=1e-6)
        assert p.next_rank == int((row > row[p.next_id]).sum()) + 1
        assert [c.id for c in p.top] == torch.topk(row, len(p.top)).indices.tolist()
        assert p.surprisal == pytest.approx(-torch.log2(row[p.next_id]).item(), abs=1e-4)


def test_cancelling_a_prefill_leaves_the_journey_as_it_was(tiny):
    s = started(tiny, 4)
    s.step()
    s.step()
    before = (list(s.ids), list(s.records), s.engine.kv_len, s.pending.decision)
    calls = []
    with pytest.raises(Cancelled):
        s.start(
            "Hello world! Sampling picks the next token from the distribution",
            cancelled=lambda: calls.append(1) or True,
        )
    assert calls == [1]  # stopped before the first pass's first layer ran
    assert (list(s.ids), list(s.records), s.engine.kv_len, s.pending.decision) == before
    s.step()  # the cache is the journey's own again
    s.rewind(3)
    assert s.ids == before[0][: len(s.prompt_ids)]


def test_a_prefill_in_one_pass_is_cancelled_between_its_layers(tiny):
    """A long pass (1,024 tokens on a CPU) need not end before Escape takes effect."""
    s = started(tiny)
    s.step()
    before = (list(s.ids), list(s.records), s.engine.kv_len, s.pending.decision)
    calls = []
    with pytest.raises(Cancelled, match=r"^prefill cancelled: the journey is as it was$"):
        s.start(PROMPT + " and the cat", cancelled=lambda: calls.append(1) or len(calls) == 2)
    assert len(calls) == 2  # the pass's first layer ran; its second did not
    assert (list(s.ids), list(s.records), s.engine.kv_len, s.pending.decision) == before
    s.step()  # the cache is the journey's own again


def test_trace_reports_the_prefill_progress(small_chunks, tmp_path):
    from tiny import save_tiny

    from tokenviz.backends.transformers.model_choice import ModelChoice
    from tokenviz.cli.headless import TraceRequest, run_trace

    reports = []
    model = ModelChoice(save_tiny(tmp_path / "tiny"), device="cpu")
    document = run_trace(
        TraceRequest(PROMPT, SamplingSettings(temperature=0, max_new_tokens=2)),
        lambda progress: ModelRunner(model.load(progress)),
        progress=lambda message, fraction: reports.append((message, fraction)),
    )
    n = len(document["prompt"])
    prefill = [(m, f) for m, f in reports if m.startswith("prefilling")]
    assert (f"prefilling the prompt: 4 of {n} tokens", 4 / n) in prefill and prefill[-1][1] == 1.0
    assert 0 < prefill[0][1] < 4 / n  # (told within the first pass, between its layers)
    assert [f for _, f in prefill] == sorted(f for _, f in prefill)


def test_a_prompt_too_large_for_free_memory_is_refused_before_it_runs(tiny, monkeypatch):
    from types import SimpleNamespace

    from tokenviz.contract.errors import PromptError

    s = started(tiny)
    s.step()
    before = (list(s.ids), s.engine.kv_len)
    monkeypatch.setattr(memory_policy.psutil, "virtual_memory", lambda: SimpleNamespace(available=10_000))
    needs = r"needs about .* GB for its KV cache and working memory, and 0\.0 GB is free"
    with pytest.raises(PromptError, match=needs):
        s.start("Hello world! Sampling picks the next token from the distribution")
    assert (list(s.ids), s.engine.kv_len) == before  # nothing ran, nothing lost


def test_the_memory_a_prefill_needs_counts_attention_scores_only_where_eager_attention_makes_them(monkeypatch):
    """A 4,096-token prompt of the bundled model's shape in one pass: its cache and logits need 1.8 GB;
    eager attention's scores (9 heads over 4,096 keys per position) 1.2 GB more, sdpa's kernels none."""
    from types import SimpleNamespace

    from tokenviz.contract.errors import PromptError
    from tokenviz.contract.records import ModelInfo

    shape = dict(name="m", device="cuda", dtype="bfloat16", layers=30, heads=9, kv_heads=3, head_dim=64, hidden=576)
    sdpa = ModelInfo(
        **shape,
        vocab=49152,
        context=8192,
        architecture="llama",
        tied_embeddings=True,
        positions="",
        attention="sdpa; the weights shown are computed exactly when asked",
    )
    eager = dataclasses.replace(sdpa, attention="eager: transformers has no fast path for this model's attention")
    free = 2.5 * 2**30 / memory_policy.MEMORY_SHARE
    monkeypatch.setattr(memory_policy.psutil, "virtual_memory", lambda: SimpleNamespace(available=free))
    memory_policy.check_memory(sdpa, 4096, 4096)
    with pytest.raises(PromptError):
        memory_policy.check_memory(eager, 4096, 4096)


def test_the_predictions_are_made_when_read_from_plain_data_and_equal_the_whole_tuple(tiny, monkeypatch):
    s = Session(ModelRunner(tiny), SamplingSettings(seed=4))
    s.start(PROMPT)
    predictions = s.records[0].prompt_predictions
    # Every piece a position shows was decoded in the prefill (the engine's thread): reading them on
    # another thread asks the tokenizer nothing.
    monkeypatch.setattr(s.engine.pieces, "piece", lambda token: pytest.fail("the UI decoded a piece"))
    monkeypatch.setattr(s.engine.tokenizer, "decode", lambda *a, **k: pytest.fail("the UI decoded a piece"))
    shown = predictions[-1]
    whole = tuple(predictions)
    assert len(whole) == len(s.prompt_ids) - 1 and whole[-1] is shown  # made once
    assert predictions == whole and whole == predictions and hash(predictions) == hash(whole)
    assert predictions[1:3] == whole[1:3] and predictions[-2] == whole[-2]
    assert predictions != whole[:-1] and predictions != "text"
    with pytest.raises(IndexError):
        predictions[len(whole)]
    monkeypatch.undo()
    fresh = ModelRunner(tiny)  # the pieces, as one-by-one decoding makes them
    assert all(c.text == fresh.piece(c.id) for p in whole for c in p.top)
    # A record may outlive its model and cross to the UI: it holds plain data, never the model or its
    # tokenizer, and a copy of it is the records themselves.
    held = reachable(predictions, depth=6)
    assert not any(isinstance(r, (ModelRunner, torch.nn.Module, type(s.engine.tokenizer))) for r in held)
    assert not any(type(r).__name__ == "TokenPieces" for r in held)
    copied = pickle.loads(pickle.dumps(s.records[0]))
    assert copied == s.records[0] and isinstance(copied.prompt_predictions, tuple)
    assert len(pickle.dumps(s.records[0])) < 20 * len(pickle.dumps(whole[0])) * len(whole)


def reachable(start, depth: int) -> list:
    """The objects `start` refers to, up to `depth` references away (classes and modules not followed)."""
    seen, layer, found = {id(start)}, [start], []
    for _ in range(depth):
        layer = [r for o in layer for r in gc.get_referents(o) if not isinstance(r, (type, types.ModuleType))]
        layer = [r for r in layer if id(r) not in seen and not seen.add(id(r))]
        found += layer
    return found


def test_deferred_predictions_equal_the_prefills_own_and_reach_every_kept_path(monkeypatch):
    """With defer_predictions the prefill runs the model's own pass (the output layer on the last
    position only: the hidden states kept) and the prompt's predictions come later, chunk by chunk,
    equal to those made at once, in the prompt's record and in every branch's copy of it. A runner whose
    output layer, run again, would not give the model's own logits keeps every position's logits."""
    from families import family_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    prompt = "The cat sat on the mat. The dog ran to the park"
    settings = SamplingSettings(temperature=0, max_new_tokens=8)
    eager = Session(ModelRunner(family_model("llama")), settings, prefill_chunk=4)
    eager.start(prompt)
    runner = ModelRunner(family_model("llama"))
    deferred = Session(runner, settings, prefill_chunk=4)
    deferred.start(prompt, defer_predictions=True)
    n = len(deferred.prompt_ids)
    assert head_reproduces(runner.model) is True and deferred.records[0].prompt_predictions == ()
    assert deferred.deferred.left == n - 1 and deferred.pending.top == eager.pending.top
    deferred.step()
    deferred.reset()  # the path left is kept as a branch, holding the prompt's record as it was
    assert deferred.score_prompt(chunks=1) == n - 1 - 4
    assert deferred.score_prompt() == 0
    made, reference = deferred.records[0].prompt_predictions, eager.records[0].prompt_predictions
    assert len(made) == n - 1 and list(made) == list(reference)
    assert deferred.branches.paths and deferred.branches.paths[0].records[0].prompt_predictions is made

    checked = ModelRunner(family_model("llama"))
    settle_head(checked.model, False)  # as a family whose output layer does more than tokenviz's head knows
    fallback = Session(checked, settings, prefill_chunk=4)
    fallback.start(prompt, defer_predictions=True)
    assert fallback.deferred.left == 0 and list(fallback.records[0].prompt_predictions) == list(reference)


def test_trace_makes_the_prompts_predictions_only_for_the_files_that_show_them(tmp_path):
    """trace's document holds no prediction at a prompt position, so its prefill runs the output layer
    over the last position alone; with --save the journey keeps every position's, as the app's do."""
    from tiny import tiny_model

    from tokenviz.cli.headless import TraceRequest, run_trace
    from tokenviz.files.journey_file import read_journey, snapshot_from_journey

    loaded = tiny_model("llama")
    rows: list[int] = []  # the positions the output layer ran over, call by call
    hook = loaded.model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[-2]))
    settings = SamplingSettings(temperature=0, max_new_tokens=2)
    try:
        document = run_trace(TraceRequest(PROMPT, settings), loader=lambda progress: ModelRunner(loaded))
        n = len(document["prompt"])
        assert n > 2 and rows and max(rows) == 1
        rows.clear()
        asked = TraceRequest(PROMPT, settings, save=str(tmp_path / "j.json"))
        run_trace(asked, loader=lambda progress: ModelRunner(loaded))
        assert sum(rows) >= n - 1
    finally:
        hook.remove()
    kept = snapshot_from_journey(read_journey(tmp_path / "j.json")).records[0].prompt_predictions
    whole = Session(ModelRunner(loaded), settings)
    whole.start(PROMPT)  # (every position's prediction made in the prefill)
    made = whole.records[0].prompt_predictions
    assert len(kept) == len(made) == n - 1
    assert_close(list(kept), [dataclasses.replace(p, next_logprob=None) for p in made])  # (files keep no logprob)
