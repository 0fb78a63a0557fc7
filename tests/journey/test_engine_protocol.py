"""The engine protocol (contract.engine): the transformers backend implements every capability and says
so; capabilities stand side by side (an engine with the lens and no cache is one); the journey runs on
the protocol alone; an engine that lacks a capability makes the keys that
need it say so in one line, off in the footer, marked in the palette, and the model view lists what
it can do."""

import dataclasses

import pytest
from apptools import model_text, settle, wait_for
from families import family_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.engine import (
    PROTOCOLS,
    AttentionRows,
    Caching,
    Capability,
    Intervenable,
    Lens,
    in_order,
    refusal_of,
    require,
    shared_prefix,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.record_json import as_json
from tokenviz.journey.session import Session
from tokenviz.ui.app import TokenvizApp
from tokenviz.ui.keys import needs_of
from tokenviz.worker.engine_thread import EngineWorker

PROMPT = "The cat sat on the mat. The dog"


CACHED = (Capability.STEP, Capability.CACHE, Capability.ATTENTION)


class CachedOnly:
    """An engine with a cache and attention rows and nothing more: the transformers engine behind
    exactly Engine's, Caching's and AttentionRows' methods, what a backend without the model's layers
    (a served model with a cache of its own) offers. The lens's and interventions' methods are not there."""

    def __init__(self, loaded_or_runner):
        runner = loaded_or_runner if isinstance(loaded_or_runner, ModelRunner) else ModelRunner(loaded_or_runner)
        self._runner = runner
        self.info = dataclasses.replace(runner.info, capabilities=in_order(CACHED), distribution="the top 20")
        self.special_ids, self.eos_ids = runner.special_ids, runner.eos_ids
        self.device, self.tokenizer = runner.device, runner.tokenizer
        for name in CACHED_METHODS:
            setattr(self, name, getattr(runner, name))

    pieces = property(lambda self: self._runner.pieces)
    kv_len = property(lambda self: self._runner.kv_len)
    kv_bytes = property(lambda self: self._runner.kv_bytes)
    cache = property(lambda self: self._runner.cache)

    def twin(self):
        return CachedOnly(self._runner.twin())


CACHED_METHODS = (
    "use_cache", "chat_ids", "joined", "read_routing", "encode", "decode", "piece", "learn_pieces", "reset",
    "crop", "forward", "logits_after", "attention", "beam_search", "speculate", "recompute", "recomputed_as",
)  # fmt: skip


def test_the_transformers_engine_implements_every_capability_and_declares_it():
    runner = ModelRunner(family_model("llama"))
    for protocol in PROTOCOLS.values():
        assert isinstance(runner, protocol)
    assert runner.info.capabilities == tuple(c.value for c in Capability) and set(PROTOCOLS) == set(Capability)
    assert "whole vocabulary" in runner.info.distribution
    assert runner.twin().info == runner.info and runner.twin().cache is not runner.cache
    assert "capabilities" in as_json(runner.info) and as_json(runner.info)["capabilities"][0] == "step"


class LensNoCache:
    """An engine with the lens and attention rows and no cache here (a served model with vllm-lens): the
    transformers engine behind Engine's, Lens's and AttentionRows' methods alone."""

    def __init__(self, runner: ModelRunner):
        self.info = dataclasses.replace(
            runner.info, capabilities=in_order((Capability.STEP, Capability.LENS, Capability.ATTENTION))
        )
        self.inspect, self.attention = runner.inspect, runner.attention


def test_capabilities_stand_side_by_side_and_a_lacking_one_is_one_line():
    cached = CachedOnly(family_model("llama"))
    assert isinstance(cached, Caching) and isinstance(cached, AttentionRows)
    assert not isinstance(cached, Lens) and not isinstance(cached, Intervenable)
    assert not hasattr(cached, "inspect") and not hasattr(cached, "intervene")
    lens_only = LensNoCache(ModelRunner(family_model("llama")))  # (what a tier of a cache could not say)
    assert isinstance(lens_only, Lens) and isinstance(lens_only, AttentionRows) and not isinstance(lens_only, Caching)
    info = cached.info
    assert (
        refusal_of(info, Capability.CACHE, "verify") is None and require(cached, Capability.CACHE, "verify") is cached
    )
    line = refusal_of(info, Capability.LENS, "the logit lens")
    assert line is not None and "\n" not in line and "logit lens" in line and info.name in line
    with pytest.raises(TokenvizError) as refused:
        require(cached, Capability.LENS, "the logit lens")
    assert str(refused.value) == line
    assert require(lens_only, Capability.LENS, "the logit lens") is lens_only
    with pytest.raises(TokenvizError, match="needs the engine's kv cache"):
        require(lens_only, Capability.CACHE, "verify")
    assert shared_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and shared_prefix([], [1]) == 0


def test_a_grammar_on_an_engine_that_draws_says_so_though_its_tokenizer_is_here():
    """Issue 69, finding 3: a served model with --tokenizer DIR was said to lack the local tokenizer when G
    was pressed; it has it (counting tokens), and a grammar stage needs tokenviz to draw the token."""
    from tokenviz.contract.engine import why_not

    info = dataclasses.replace(
        ModelRunner(family_model("llama")).info,
        capabilities=in_order({Capability.STEP, Capability.TOKENIZER, Capability.LENS}),
        requests="the server at 127.0.0.1:8000",
        numbers_of="the server",
        covers=20,
        draws="the server, with the settings sent",
    )
    assert refusal_of(info, Capability.TOKENIZER, "counting tokens") is None
    brief = why_not(info, Capability.GRAMMAR)
    assert brief == "the server draws each token itself; a grammar needs tokenviz to draw (M says more)"
    line = refusal_of(info, Capability.GRAMMAR, "a grammar stage")
    assert line is not None and "the server draws each token itself" in line
    assert "needs the engine's local tokenizer" not in line and line.endswith("local tokenizer)")  # (it gives it)


def test_keys_and_palette_actions_name_the_capability_they_need():
    assert needs_of("view('lens')") == Capability.LENS
    assert needs_of("view('attribution')") == Capability.LEAVE_ONE_OUT
    assert needs_of("attribution('grad')") == Capability.ATTRIBUTION
    assert needs_of("attribution('loo')") == Capability.LEAVE_ONE_OUT
    assert needs_of("beams(5)") == needs_of("beams") == Capability.CACHE
    assert needs_of("ablate_head") == Capability.ABLATION  # (a server steers and patches, and ablates no head)
    assert needs_of("grammar") == Capability.GRAMMAR  # (a tokenizer here, and tokenviz drawing)
    assert needs_of("step") is None and needs_of("view('charts')") is None


def test_the_journey_runs_on_an_engine_with_a_cache_and_no_lens():
    session = Session(CachedOnly(family_model("llama")), SamplingSettings(temperature=0, max_new_tokens=3))
    session.start(PROMPT)
    while session.step() is not None:
        pass
    full = Session(ModelRunner(family_model("llama")), SamplingSettings(temperature=0, max_new_tokens=3))
    full.start(PROMPT)
    while full.step() is not None:
        pass
    assert session.ids == full.ids and [r.top for r in session.records] == [r.top for r in full.records]


async def test_a_key_whose_view_needs_a_capability_the_engine_lacks_says_so():
    worker = EngineWorker(lambda progress: CachedOnly(family_model("llama")), SamplingSettings(temperature=0), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 36)) as pilot:
        s = await settle(app, pilot)
        assert s.info is not None and s.info.capabilities == in_order(CACHED)
        views = app.query_one("#views")
        shown_before = views.current
        await pilot.press("l")  # the logit lens: not on this engine
        await wait_for(lambda: any("logit lens" in str(n.message) for n in app._notifications), pilot)
        line = next(str(n.message) for n in app._notifications if "logit lens" in str(n.message))
        assert "does not give its logit lens here (M lists what it gives)" in line and "\n" not in line, line
        assert "needs the logit lens" not in line  # (issue 69, finding 4: the reason, not the question back)
        assert views.current == shown_before  # the view did not open
        screen = app.journey
        assert screen.check_action("view", ("lens",)) is False and screen.check_action("ablate_head", ()) is False
        assert screen.check_action("verify", ()) is True and screen.check_action("view", ("charts",)) is True
        await pilot.press("M")
        await wait_for(lambda: views.current == "model", pilot)
        pane = app.query_one("#model")
        await wait_for(lambda: "can: step, kv cache, attention rows" in model_text(pane), pilot)
        assert "not: logit lens, leave-one-out" in model_text(pane)
        await pilot.press("question_mark")
        await wait_for(lambda: app.screen.query("#help"), pilot)
        help_text = app.screen.text
        assert help_text.startswith("**Not on this engine**") and "l, m (logit lens)" in help_text.split("\n")[0]
        assert "b (" not in help_text.split("\n")[0]  # the branch tree needs nothing more than a step


@pytest.mark.parametrize("engine", [ModelRunner, CachedOnly])
async def test_the_palette_marks_what_the_engine_cannot_do(engine):
    from textual.command import CommandPalette

    from tokenviz.ui.command_palette import TokenvizCommands

    worker = EngineWorker(lambda progress: engine(family_model("llama")), SamplingSettings(temperature=0), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        provider = TokenvizCommands(app.journey)
        hits = [hit async for hit in provider.search("logit lens")]
        assert hits
        helps = [hit.help or "" for hit in hits]
        if engine is CachedOnly:
            assert any("needs the engine's logit lens" in h for h in helps)
        else:
            assert not any(helps)
        assert not isinstance(app.screen, CommandPalette)


def test_a_head_ablation_on_an_engine_without_it_is_refused_before_the_model_runs():
    """Issue 69, finding 22: on a served model `z` on the mean map asked for a head first, then said it
    could not ablate one; a head's ablation is a capability of its own, said first."""
    from tokenviz.contract.engine import why_not
    from tokenviz.contract.interventions import HeadAblation

    runner = ModelRunner(family_model("llama"))
    info = dataclasses.replace(runner.info, capabilities=in_order(set(Capability) - {Capability.ABLATION}))
    said = (("head ablation", "a head cannot be ablated inside a server; steering and patching work"),)
    assert why_not(dataclasses.replace(info, lacks_why=said), Capability.ABLATION).startswith(
        "a head cannot be ablated inside a server"
    )  # (the backend's own words)
    runner.info = info
    session = Session(runner, SamplingSettings(temperature=0))
    session.start(PROMPT)
    before = session.records[-1]
    with pytest.raises(TokenvizError, match="needs the engine's head ablation"):
        session.set_interventions([HeadAblation(0, 1)])
    assert session.interventions == () and session.records[-1] == before
