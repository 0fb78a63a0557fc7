"""The journey on tiny models: cached steps against full recomputes, rewind, branch, stops."""

import numpy as np
import pytest
import torch
from stock import saved, stock_forward
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import PromptError, TokenvizError
from tokenviz.contract.records import StepRecord
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.chips import chips_of
from tokenviz.journey.session import Session

PROMPT = "The Eiffel Tower is located in"


def make(loaded, **settings):
    return Session(ModelRunner(loaded), SamplingSettings(**settings))


def full_forward(loaded, ids):
    out = stock_forward(saved(loaded.model), ids)
    return out.logits[0, -1], [a[0, :, -1, :] for a in out.attentions]


def test_cached_steps_equal_a_full_recompute(tiny):
    s = make(tiny, temperature=0.9, top_k=0, top_p=1.0, seed=4)
    s.start(PROMPT)
    for _ in range(30):
        s.step()
    assert len(s.generated_ids) == 30 and s.engine.kv_len == len(s.ids)
    logits, rows = full_forward(tiny, s.ids)
    assert torch.allclose(s.pending_logits.cpu(), logits, atol=1e-4)  # (the recompute runs on the CPU)
    last = s.records[-1]
    shown = s.attention(range(len(s.ids) - 1, len(s.ids)), range(tiny.info.layers))
    assert shown.shape == (tiny.info.layers, tiny.info.heads, 1, len(s.ids)) and shown.dtype == np.float32
    for layer, row in enumerate(rows):
        assert np.allclose(shown[layer, :, 0, :], row.cpu().numpy(), atol=1e-5)
    top_ids = [c.id for c in last.top]
    assert top_ids == torch.topk(logits, len(top_ids)).indices.tolist()


def test_the_prompts_attention_is_the_whole_causal_block(tiny):
    s = make(tiny)
    first = s.start(PROMPT)
    n = len(s.prompt_ids)
    assert first.index == 0 and first.position == n and first.input_ids == tuple(s.prompt_ids)
    block = s.attention(range(n), range(tiny.info.layers))
    assert block.shape == (tiny.info.layers, tiny.info.heads, n, n)
    assert np.allclose(block.sum(-1), 1.0, atol=1e-5)
    assert np.all(block[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)  # causal


def test_rewind_then_replay_gives_identical_records(tiny):
    settings = dict(temperature=0.8, top_k=20, top_p=0.95, seed=9)
    straight = make(tiny, **settings)
    straight.start(PROMPT)
    for _ in range(10):
        straight.step()

    s = make(tiny, **settings)
    s.start(PROMPT)
    for _ in range(10):
        s.step()
    before = s.records[6]
    assert s.rewind(4) == 4
    assert len(s.generated_ids) == 6 and s.engine.kv_len == len(s.ids) and len(s.records) == 7
    assert s.records[-1].decision == before.decision  # same logits, same decision
    for _ in range(4):
        s.step()
    assert s.ids == straight.ids
    for a, b in zip(s.records, straight.records):
        assert a.top == b.top and a.decision.chosen_id == b.decision.chosen_id
        assert a.decision.stages == b.decision.stages and a.decision.u == b.decision.u
    n = len(s.ids)
    assert np.allclose(s.attention(range(n), [0, 1]), straight.attention(range(n), [0, 1]), atol=1e-6)
    assert torch.equal(s.pending_logits, straight.pending_logits)


def test_rewind_to_the_prompt_and_past_it(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    first = s.records[0].decision
    for _ in range(3):
        s.step()
    assert s.rewind(99) == 3  # clamped to what was generated
    assert s.ids == s.prompt_ids and s.engine.kv_len == len(s.prompt_ids)
    assert s.records[0].decision == first
    assert s.rewind(1) == 0


def test_greedy_steps_equal_generate(tiny):
    s = make(tiny, temperature=0)
    s.start(PROMPT)
    for _ in range(12):
        s.step()
    ids = torch.tensor([s.prompt_ids], device=tiny.model.device)
    out = tiny.model.generate(ids, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    assert s.generated_ids == out[0, len(s.prompt_ids) :].tolist()


def test_settings_change_redecides_without_a_forward(tiny_llama):
    s = make(tiny_llama, temperature=1.0, top_k=0, top_p=1.0, seed=1)
    s.start(PROMPT)
    calls = []
    original = s.engine.forward
    s.engine.forward = lambda ids: calls.append(ids) or original(ids)
    u = s.pending.decision.u
    s.set_settings(s.settings.replace(top_k=1))
    assert calls == []
    assert s.pending.decision.chosen_id == s.pending.top[0].id
    assert [st.name for st in s.pending.decision.stages] == ["top-k"] and s.pending.decision.u == u
    s.set_settings(s.settings.replace(temperature=0))
    assert s.pending.decision.mode == "greedy" and calls == []


def test_force_and_branch_take_another_ranked_token(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    for _ in range(3):
        s.step()
    second = s.records[1].top[1].id
    s.take_rank(2, steps_back=2)
    assert len(s.generated_ids) == 2 and s.generated_ids[1] == second
    assert s.records[1].decision.mode == "forced" and s.records[1].decision.raw_rank == 2
    s.step(forced_id=5)
    assert s.generated_ids[-1] == 5
    with pytest.raises(TokenvizError, match="vocabulary"):
        s.step(forced_id=10**6)
    with pytest.raises(TokenvizError, match="rank"):
        s.take_rank(99)


def test_stops_at_max_new_tokens_and_resumes_when_raised(tiny_llama):
    s = make(tiny_llama, temperature=0, max_new_tokens=3)
    s.start(PROMPT)
    while s.step() is not None:
        pass
    assert len(s.generated_ids) == 3 and s.stop_reason == "max new tokens (3)" and s.pending is None
    assert s.step() is None
    s.set_settings(s.settings.replace(max_new_tokens=5))
    assert s.step() is not None and s.stop_reason is None
    s.rewind(1)
    assert len(s.generated_ids) == 2


def test_stops_at_eos(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    eos = tiny_llama.tokenizer.eos_token_id
    assert s.step(forced_id=eos) is None
    assert s.stop_reason == "end of sequence" and s.generated_ids == [eos]


def test_stops_at_a_stop_string(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    s.step()
    text = s.generated_text
    s2 = make(tiny_llama, temperature=0, stop=(text[-1],))
    s2.start(PROMPT)
    assert s2.step() is None and s2.stop_reason.startswith("stop string")


def test_context_limit_refuses_long_prompts_and_stops_cleanly():
    loaded = tiny_model("gpt2", context=16)
    s = make(loaded, temperature=0)
    with pytest.raises(PromptError, match="at most 16"):
        s.start("The Eiffel Tower is located in Paris, the capital of France, and it is tall.")
    with pytest.raises(PromptError, match="empty"):
        s.start("")
    s.start("The cat sat")
    while s.step() is not None:
        pass
    assert s.stop_reason == "context full (16 tokens)" and len(s.ids) == 16


def test_kv_cache_size_is_reported(tiny_llama):
    s = make(tiny_llama)
    s.start(PROMPT)
    s.step()
    info = tiny_llama.info
    per_token = 2 * info.layers * info.kv_heads * info.head_dim * 4  # keys + values, float32
    assert s.records[-1].kv_len == len(s.ids)
    assert s.records[-1].kv_bytes == per_token * len(s.ids)


def test_records_hold_no_tensors(tiny_llama):
    s = make(tiny_llama)
    s.start(PROMPT)
    s.step()

    def walk(value):
        assert not isinstance(value, torch.Tensor)
        if isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))

    for record in s.records:
        walk(record)


def test_pieces_make_bytes_and_specials_visible(tiny_llama):
    s = make(tiny_llama)
    s.start("é\n")
    chips = chips_of(s)
    # "é" is two byte tokens here, neither a whole character: each shows as its byte
    assert [c.text for c in chips] == ["<0xC3>", "<0xA9>", "\n"]
    assert s.text == "é\n"
    eos = tiny_llama.tokenizer.eos_token_id
    s.step(forced_id=eos)
    assert chips_of(s)[-1].is_special and not chips_of(s)[-1].is_prompt


def test_start_from_token_ids(tiny_llama):
    s = make(tiny_llama, temperature=0)
    ids = s.engine.encode(PROMPT)
    s.start(ids)
    assert s.prompt_ids == ids and s.prompt == s.engine.decode(ids)
    text = make(tiny_llama, temperature=0)
    text.start(PROMPT)
    assert s.pending.top == text.pending.top
    with pytest.raises(PromptError, match="token ids"):
        s.start([10**7])


def test_rewinding_and_stepping_differently_keeps_the_old_path_as_a_branch(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    for _ in range(5):
        s.step()
    first_path = list(s.ids)
    s.take_rank(2, steps_back=3)  # back 3 tokens, take the 2nd ranked there instead
    s.step()
    summaries = s.branch_summaries()
    assert [b.current for b in summaries] == [True, False]
    other = summaries[1]
    assert other.tokens == 5 and other.shared == len(s.prompt_ids) + 2
    assert other.text == s.engine.decode(first_path[len(s.prompt_ids) :])
    expected = sum(np.log(r.decision.raw_prob) for r in make_and_run(tiny_llama, 5).records[:5])
    assert other.logprob == pytest.approx(expected, abs=1e-4)
    current_ids, current_pending = list(s.ids), s.pending.decision

    s.switch_branch(other.index)  # the cache is rebuilt from the shared prefix
    assert s.ids == first_path and s.engine.kv_len == len(first_path)
    straight = make_and_run(tiny_llama, 5)
    assert s.pending.top == straight.pending.top or [c.id for c in s.pending.top] == [
        c.id for c in straight.pending.top
    ]
    assert torch.allclose(s.pending_logits, straight.pending_logits, atol=1e-4)
    assert s.last_cache_event.kept == len(s.prompt_ids) + 2
    s.step()
    assert s.generated_ids[:6] == straight.generated_ids[:5] + [s.generated_ids[5]]
    back = next(b for b in s.branch_summaries() if not b.current)
    s.switch_branch(back.index)
    assert s.ids == current_ids and s.pending.decision.chosen_id == current_pending.chosen_id


def test_a_stored_branch_is_summarised_once_while_the_current_path_grows(tiny_llama, monkeypatch):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    for _ in range(4):
        s.step()
    s.take_rank(2, steps_back=2)
    first = s.branch_summaries()
    decoded = []
    original = s.engine.decode
    monkeypatch.setattr(s.engine, "decode", lambda ids: decoded.append(tuple(ids)) or original(ids))
    s.step()
    again = s.branch_summaries()
    assert decoded == [tuple(s.generated_ids)]  # only the current path is decoded again
    assert again[1] == first[1]  # the stored branch's figures are unchanged
    assert again[0].tokens == first[0].tokens + 1


def test_stepping_the_same_way_again_leaves_no_duplicate_branch(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    for _ in range(4):
        s.step()
    s.rewind(2)
    s.step()
    s.step()  # the same greedy tokens again
    assert len(s.branch_summaries()) == 1
    s.start(PROMPT)  # a reset keeps the path it leaves
    assert len(s.branch_summaries()) == 2
    s.start("Hello world")  # a new prompt is a new tree
    assert s.branches.paths == []


def make_and_run(loaded, steps):
    s = make(loaded, temperature=0)
    s.start(PROMPT)
    for _ in range(steps):
        s.step()
    return s


def test_chips_are_kept_between_calls_and_equal_fresh_ones(tiny_llama):
    from tokenviz.contract.records import TokenChip

    s = make(tiny_llama, temperature=0)

    def fresh():
        return tuple(
            TokenChip(t, s.engine.piece(t), i < len(s.prompt_ids), t in s.engine.special_ids, False)
            for i, t in enumerate(s.ids)
        )

    s.start(PROMPT)
    first = chips_of(s)
    assert first == fresh()
    for _ in range(3):
        s.step()
        assert chips_of(s) == fresh()
    assert chips_of(s)[0] is first[0]  # a grown journey reuses the chips it had
    s.rewind()
    assert chips_of(s) == fresh()
    s.step(forced_id=5)
    assert chips_of(s) == fresh()
    s.start("another prompt")
    assert chips_of(s) == fresh() and chips_of(s)[0] is not first[0]


def test_a_step_whose_output_is_not_a_number_leaves_the_journey_as_it_was(tiny_llama):
    s = make(tiny_llama, temperature=0)
    s.start(PROMPT)
    s.step()
    ids, pending, kv = list(s.ids), s.pending, s.engine.kv_len
    head = s.engine.model.lm_head
    hook = head.register_forward_hook(lambda module, args, out: out.fill_(float("nan")))
    try:
        with pytest.raises(TokenvizError, match="not a number"):
            s.step()
    finally:
        hook.remove()
    assert s.ids == ids and s.pending is pending and s.engine.kv_len == kv
    assert s.step() is not None  # and it goes on once the model computes numbers again


def test_a_steps_record_is_built_once(monkeypatch):
    """The decision hands the session what it decided, and the session builds the step's record once
    with the pass's figures (it was built, then rebuilt by a replace)."""
    built = []
    made = StepRecord.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        made(self, *args, **kwargs)

    s = make(tiny_model("llama"), temperature=0.8, seed=1)
    monkeypatch.setattr(StepRecord, "__init__", counted)
    s.start(PROMPT)
    for _ in range(3):
        s.step()
    assert len(built) == len(s.records) == 4
