"""The least a backend gives (contract.stepping.Stepping) made a whole engine (journey.stepped_engine): a
journey of rewinds and branches on it is the one a full recompute of each context gives, and what a
Stepping lacks or gets wrong is one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from fixed_backend import VOCAB, FixedModel

from tokenviz.contract.engine import Capability, Lens, in_order, require
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.journey.stepped_engine import SteppedEngine, as_engine


def peak_after(context: Sequence[int]) -> int:
    """The token the context model puts first after `context`: it depends on every token of it."""
    return (sum((i + 1) * t for i, t in enumerate(context)) * 7 + len(context)) % VOCAB


class ContextModel(FixedModel):
    """A Stepping whose next token depends on the whole context it holds, and which counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []
        self.calls = 0

    def forward(self, ids: list[int]) -> list[float]:
        self.held.extend(ids)
        self.calls += 1
        peak = peak_after(self.held)
        return [-abs(i - peak) - i * 1e-3 for i in range(VOCAB)]  # (one most likely token: no ties)

    def crop(self, length: int) -> None:
        del self.held[length:]


def test_a_journey_of_rewinds_and_branches_on_a_stepping_is_a_full_recomputes():
    session = Session(as_engine(ContextModel()), SamplingSettings(temperature=0, max_new_tokens=40))
    session.start("abc")
    for _ in range(5):
        session.step()
    session.rewind(2)
    session.take_rank(3)  # a branch: the third most likely token
    for _ in range(3):
        session.step()
    session.switch_branch(0)  # back to the first path, whose cache is fed again
    session.step()
    stepping = session.engine.stepping
    assert stepping.held == session.ids  # what the Stepping holds is the journey's path, no more
    prompt = len(session.prompt_ids)
    for position in range(prompt, len(session.ids)):
        record = session.records[position - prompt]
        assert record.top[0].id == peak_after(session.ids[:position]), position
    assert session.records[-1].top[0].id == peak_after(session.ids)
    engine, kept = session.engine, session.engine.cache
    engine.forward([1, 2])
    engine.use_cache(kept)  # (going back to a cache: cropped to the shared start, the rest fed again)
    assert stepping.held == list(kept) == session.ids


def test_every_positions_predictions_are_one_call_per_token_and_equal_the_single_steps():
    engine = as_engine(ContextModel())
    whole = engine.forward([3, 4, 5, 6], every_position=True)
    assert engine.stepping.calls == 4 and engine.kv_len == 4
    for row, position in zip(whole.rows, range(1, 5)):
        assert int(row.argmax()) == peak_after([3, 4, 5, 6][:position])
    engine.reset()
    single = engine.forward([3, 4, 5, 6])
    torch.testing.assert_close(single.logits, whole.logits, rtol=0, atol=1e-6)
    told = []
    with pytest.raises(Cancelled):
        engine.forward(
            [1, 2, 3], every_position=True, cancelled=lambda: len(told) == 2, progress=lambda d, n: told.append(d)
        )
    assert told == [1, 2] and engine.kv_len == 6  # (what was fed is the caller's to undo: Session crops it)


class WrongSize(FixedModel):
    def forward(self, ids):
        return [0.0] * (VOCAB - 1)


class NotNumbers(FixedModel):
    def forward(self, ids):
        return ["a"] * VOCAB


def test_what_a_stepping_gets_wrong_or_lacks_is_one_line():
    with pytest.raises(TokenvizError, match="fixed's backend gave 95 logits for a vocabulary of 96"):
        as_engine(WrongSize()).forward([1])
    with pytest.raises(TokenvizError, match="fixed's backend gave logits that are not numbers"):
        as_engine(NotNumbers()).forward([1])
    engine = as_engine(ContextModel())
    with pytest.raises(TokenvizError, match="fixed has no chat template here"):
        engine.chat_ids("hi")
    with pytest.raises(TokenvizError, match="the backend made a str: no engine, Stepping or DrawingModel"):
        as_engine("a model")  # type: ignore[arg-type]
    assert isinstance(engine.twin(), SteppedEngine) and engine.twin().kv_len == 0  # (FixedModel twins)


def test_a_stepping_that_opens_no_twin_runs_one_journey_and_says_so():
    one = type("OneJourney", (), {k: v for k, v in vars(FixedModel).items() if k != "twin"})  # (FixedModel, less twin)
    with pytest.raises(TokenvizError, match="fixed runs one journey at a time"):
        as_engine(one()).twin()


class WithLens(FixedModel):
    """A Stepping that gives the lens too (its own protocol, found by asking)."""

    def __init__(self) -> None:
        super().__init__()
        self.info = dataclasses.replace(self.info, capabilities=in_order({Capability.STEP, Capability.LENS}))

    def inspect(self, ask):
        return ["its own"]


def test_a_capability_a_stepping_gives_is_found_by_asking_and_one_it_lacks_is_refused():
    engine = as_engine(WithLens())
    assert isinstance(engine, Lens) and require(engine, Capability.LENS, "the lens").inspect(None) == ["its own"]
    plain = as_engine(FixedModel())
    assert not isinstance(plain, Lens)
    with pytest.raises(TokenvizError, match="the lens needs the engine's logit lens, which fixed does not give"):
        require(plain, Capability.LENS, "the lens")
    plain.info = WithLens().info  # (declared, not given: the backend's mistake, said so)
    with pytest.raises(TokenvizError, match="fixed's backend declares its logit lens without giving it"):
        require(plain, Capability.LENS, "the lens")


def test_a_drawing_models_token_outside_its_vocabulary_is_one_line():
    from drawn_backend import DrawingFixed

    from tokenviz.contract.results import Drawn

    class Outside(DrawingFixed):
        def draw(self, ids, settings):
            return Drawn(chosen=3, logprob=-1.0, rank=1, top=((3, -1.0), (500, -2.0)), raw=True, ms=0.0)

    engine = as_engine(Outside())
    with pytest.raises(TokenvizError, match="drawn's backend gave token 500, outside its vocabulary"):
        engine.draw([1, 2], SamplingSettings())
