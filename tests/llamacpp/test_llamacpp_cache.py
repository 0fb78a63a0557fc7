"""The cache read and fed again on a GGUF in llama.cpp: verify, the watched tokens at past steps and beam
search, each held to llama-cpp-python's own logits for the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
from llama_reference import PROMPT, greedy_session, offloaded_args

from tokenviz.contract.commands import DEFAULT_DRAFTER
from tokenviz.contract.engine import SearchAsk

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]


@pytest.fixture(scope="module")
def session(llama_cpp):
    return greedy_session(4)


def test_logits_after_are_llama_cpps_own_and_leave_the_journeys_cache(session, reference):
    engine, ids = session.engine, list(session.ids)
    held, pending = list(engine.fed), session.pending
    start = len(ids) - 3
    logits = engine.logits_after(ids, start).numpy()
    reference.reset()
    reference.eval(ids)
    own = np.asarray(reference.scores[start : len(ids)], dtype=np.float32)
    assert logits.shape == own.shape and np.abs(logits - own).max() < 1e-3  # (a batch's sums, as its own)
    assert list(engine.fed) == held  # the journey's cache as it was
    session.step()
    session.rewind(1)
    assert session.pending.top == pending.top  # and it goes on as before


def test_verify_recomputes_from_an_empty_cache_and_agrees(session):
    from tokenviz.journey.verification import verify_latest

    engine = session.engine
    told = []
    found = verify_latest(engine, list(engine.fed), lambda done, total: told.append((done, total)))
    assert found.argmax_agrees and found.max_logit_diff < 1e-3 and found.max_attention_diff < 1e-4
    assert told[-1][0] == told[-1][1]


def test_a_beam_searchs_hypotheses_score_as_llama_cpp_scores_their_tokens(session, reference):
    """Each finished hypothesis's log-probability is the sum of llama.cpp's own log-probabilities of its
    tokens after the context (llama-cpp-python's, fed the same tokens); the best is at least the greedy
    path's; the journey goes on as it was."""
    engine, ids = session.engine, list(session.ids[: len(session.prompt_ids)])
    held = list(engine.fed)
    result = engine.beam_search(SearchAsk(tuple(ids), 4), width=3)
    assert len(result.final) == 3 and result.steps[0].beams == (((), 0.0),)
    for hypothesis in result.final:
        reference.reset()
        reference.eval([*ids, *hypothesis.ids])
        scores = np.asarray(reference.scores[len(ids) - 1 : len(ids) - 1 + len(hypothesis.ids)], dtype=np.float64)
        logprobs = scores - np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1, keepdims=True))
        logprobs -= scores.max(-1, keepdims=True)
        own = float(sum(logprobs[i, token] for i, token in enumerate(hypothesis.ids)))
        assert hypothesis.logprob == pytest.approx(own, abs=2e-3), hypothesis
    greedy = session.generated_ids[:4]
    reference.reset()
    reference.eval([*ids, *greedy])
    scores = np.asarray(reference.scores[len(ids) - 1 : len(ids) + 3], dtype=np.float64)
    greedy_logprob = sum(
        float(scores[i, t] - scores[i].max() - np.log(np.exp(scores[i] - scores[i].max()).sum()))
        for i, t in enumerate(greedy)
    )
    assert max(h.logprob for h in result.final) >= greedy_logprob - 1e-3
    assert list(engine.fed) == held


def test_greedy_speculation_gives_llama_cpps_own_greedy_tokens_and_a_model_drafter_is_refused(session, reference):
    """Speculation changes the speed, never the text: greedy, prompt lookup's drafts accepted or not, the
    tokens are the argmax of llama-cpp-python's own logits, one at a time."""
    from tokenviz.contract.errors import TokenvizError

    engine, ids = session.engine, list(session.ids[: len(session.prompt_ids)])
    prompt = ids + ids[1:]  # (the prompt twice: prompt lookup has something to draft)
    held = list(engine.fed)
    spec = engine.speculate(SearchAsk(tuple(prompt), 8), "prompt-lookup", session.settings)
    reference.reset()
    reference.eval(prompt)
    greedy = []
    for _ in range(8):
        greedy.append(int(np.argmax(reference.scores[len(prompt) - 1 + len(greedy)])))
        reference.eval(greedy[-1:])
    assert list(spec.ids) == greedy and spec.drafter == "prompt-lookup"
    assert sum(len(r.drafted) for r in spec.rounds) > 0  # (it drafted: the prompt repeats)
    assert list(engine.fed) == held
    with pytest.raises(TokenvizError, match="--backend transformers"):
        engine.speculate(SearchAsk(tuple(prompt), 4), "draft-model", session.settings)
    # the default drafter (S's) is the runtime's own choice: prompt lookup here, not a refusal (UX 7's 9)
    assert engine.speculate(SearchAsk(tuple(prompt), 8), DEFAULT_DRAFTER, session.settings) == spec


@pytest.mark.terminal
def test_s_on_llama_cpp_runs_prompt_lookup_not_a_refusal_at_120x36():
    """UX 7's finding 9: S on llama.cpp failed ("early-exit:15: a drafter that is a model is transformers'")
    where prompt lookup runs: S runs the runtime's default drafter."""
    from terminals import keys, quits_cleanly, terminal, wait_screen

    prompt = "The cat sat on the mat. The cat sat on the"
    with terminal((120, 36), prompt, "--backend", "llama.cpp", *offloaded_args(), "-t", "0") as name:
        wait_screen(name, r"ready · step 0", timeout=120)
        keys(name, "S")
        text = wait_screen(name, r"prompt-lookup · \d+ forwards", timeout=120)
        assert "a drafter that is a model" not in text and "round  1:" in text
        quits_cleanly(name)


def test_a_token_watched_after_the_steps_has_llama_cpps_own_probability_at_each(session, reference):
    ids = list(session.ids)
    token = session.records[0].top[1].id  # (the first step's runner-up)
    session.pin([token])
    try:
        reference.reset()
        reference.eval(ids)
        for record in session.records[:-1]:
            scores = np.asarray(reference.scores[record.position - 1], dtype=np.float64)
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            (watched,) = record.decision.pinned
            assert watched.id == token and watched.prob == pytest.approx(probs[token], abs=1e-4)
            assert watched.rank == 1 + int((scores > scores[token]).sum())
    finally:
        session.pin([])


def test_trace_searches_a_gguf_in_llama_cpp_and_refuses_a_model_drafter_in_one_line(monkeypatch, capsys):
    import json

    from clitools import invoke

    base = ["trace", PROMPT, "--backend", "llama.cpp", *offloaded_args(), "--steps", "4", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *base, "--beams", "3")
    assert code == 0, err
    beams = json.loads(out)["beams"]
    assert beams["width"] == 3 and len(beams["final"]) == 3
    code, out, err = invoke(monkeypatch, capsys, *base, "--speculate", "prompt-lookup", "--temperature", "0")
    assert code == 0, err
    assert json.loads(out)["speculation"]["drafter"] == "prompt-lookup"
    code, _, err = invoke(monkeypatch, capsys, *base, "--speculate", "draft-model")
    assert code == 2 and "--backend transformers" in err and "Traceback" not in err


def test_a_search_it_cannot_run_is_one_line_before_any_context_is_made(session, monkeypatch):
    """Beams and speculation under a patch (its rows are written through the journey's context), past
    llama.cpp's context, or of a width outside 2-8: each one line, and no context made for it."""
    from tokenviz.backends.llamacpp.runtime import Edits, Runtime
    from tokenviz.contract.errors import TokenvizError

    engine, ids = session.engine, tuple(session.ids)
    made = []
    monkeypatch.setattr(Runtime, "sibling", lambda self, *a, **k: made.append(k) or pytest.fail("a context made"))
    monkeypatch.setattr(engine, "edits", Edits(writes={"l_out-3": {}}))
    with pytest.raises(TokenvizError, match=r"^beam search with a patch in force is not on llama\.cpp"):
        engine.beam_search(SearchAsk(ids, 4), width=3)
    with pytest.raises(TokenvizError, match=r"^speculative decoding with a patch in force is not on llama\.cpp"):
        engine.speculate(SearchAsk(ids, 4), "prompt-lookup", session.settings)
    monkeypatch.setattr(engine, "edits", Edits())
    past = engine.runtime.context_size
    with pytest.raises(TokenvizError, match=rf"^beam search would pass llama\.cpp's context of {past:,} tokens"):
        engine.beam_search(SearchAsk(ids, past), width=2)
    with pytest.raises(TokenvizError, match=r"^speculative decoding would pass llama\.cpp's context"):
        engine.speculate(SearchAsk(ids, past), "prompt-lookup", session.settings)
    for width in (0, 1, 9):
        with pytest.raises(TokenvizError, match=rf"^beam width must be 2 to 8, got {width}$"):
            engine.beam_search(SearchAsk(ids, 4), width=width)
    assert made == []
