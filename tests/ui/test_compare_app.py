"""Compare, a mode of the one app: two journeys side by side step together; the diff pane lists
every step's KL, top-1 agreement and ranks; the token where the paths part is marked in both. Reached
by `tokenviz compare` and from the journey's palette on the journey's model."""

import copy
import time

import torch
from apptools import PROMPT, WAIT_S
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.record_json import step_diff_json
from tokenviz.journey.comparison import Comparison
from tokenviz.journey.session import Session
from tokenviz.render.units import probability
from tokenviz.ui.app import TokenvizApp
from tokenviz.ui.compare_screen import CompareScreen, DiffPane
from tokenviz.ui.keys import JOURNEY_OWNERS, routed
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.worker.comparing import CompareWorker


def compare_app() -> TokenvizApp:
    def build(progress):
        loaded = tiny_model()
        greedy = SamplingSettings(temperature=0)
        hot = SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, seed=5)
        return Comparison(Session(ModelRunner(loaded), greedy), Session(ModelRunner(loaded), hot))

    return TokenvizApp(CompareWorker(build, PROMPT), comparing=True)


async def type_comparison(app: TokenvizApp, pilot, typed: str) -> None:
    """From the journey's palette, the comparison dialog answered with `typed` (B's NAME=VALUE changes)."""
    from apptools import wait_for
    from textual.widgets import Input

    from tokenviz.ui.screens import CompareDialog

    await app.journey.run_action(routed("compare", JOURNEY_OWNERS))
    await wait_for(lambda: isinstance(app.screen, CompareDialog) and app.screen.query(Input), pilot)
    app.screen.query_one(Input).value = typed
    await pilot.press("enter")


async def settled(app: TokenvizApp, pilot):
    screen = app.screen
    assert isinstance(screen, CompareScreen)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        await pilot.pause(0.01)
        c = screen.snapshot
        if c is not None and c.a is not None and c.handled >= screen.worker.submitted and not c.playing:
            await pilot.pause()
            return c
    raise AssertionError("the comparison did not settle")


async def test_both_journeys_step_together_and_the_parting_is_marked():
    app = compare_app()
    async with app.run_test(size=(140, 40)) as pilot:
        c = await settled(app, pilot)
        assert len(c.diffs) == 1 and c.a.records and c.b.records
        await pilot.press("space", "space", "space", "space", "space", "space")
        c = await settled(app, pilot)
        assert len(c.a.records) == len(c.b.records) == 7 and len(c.diffs) == 7
        assert c.parted_at is not None
        shown = str(app.query_one(DiffPane).render())
        assert f"the paths part at step {c.parted_at}" in shown and f"{c.diffs[-1].kl:.4f}" in shown
        for side, s in (("a", c.a), ("b", c.b)):
            assert app.query_one(f"#tokens-{side}", TokensPane).marked == s.prompt_len + c.parted_at
        assert "greedy" in str(app.query_one("#label-a").render()) and "T 2" in str(app.query_one("#label-b").render())
        assert app.screen.check_action("back", ()) is False  # the whole app: no journey to go back to
        await pilot.press("backspace")
        c = await settled(app, pilot)
        assert len(c.a.records) == len(c.b.records) == 6 and len(c.diffs) == 6
        await pilot.press("a")
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # autoplay runs both to their end
            await pilot.pause(0.01)
            if app.screen.snapshot.a.stop_reason and app.screen.snapshot.b.stop_reason:
                break
        assert app.screen.snapshot.a.stop_reason and app.screen.snapshot.b.stop_reason


async def test_x_saves_both_journeys_replayable_and_the_comparison(tmp_path, monkeypatch):
    import json

    from tokenviz.files.journey_file import read_journey, recording_of

    monkeypatch.chdir(tmp_path)
    app = compare_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await settled(app, pilot)
        await pilot.press("space", "space", "space", "x")
        c = await settled(app, pilot)
        for _ in range(500):
            await pilot.pause(0.01)
            if len(list(tmp_path.glob("*.json"))) == 3:
                break
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 3
    document = json.loads(next(f for f in files if not f.stem.endswith(("-a", "-b"))).read_text())
    assert document["diff"] == [step_diff_json(d) for d in c.diffs[: len(document["a"]["steps"])]]
    for side, snapshot in (("a", c.a), ("b", c.b)):
        saved = recording_of(read_journey(next(f for f in files if f.stem.endswith(f"-{side}")))).snapshot
        assert saved.records == snapshot.records and saved.chips == snapshot.chips


async def test_question_mark_opens_the_compare_help_and_escape_closes_it():
    from tokenviz.ui.screens import HelpScreen

    app = compare_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await settled(app, pilot)
        await pilot.press("question_mark")
        for _ in range(100):
            await pilot.pause(0.01)
            if isinstance(app.screen, HelpScreen):
                break
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.query_one("#help").source
        assert "KL(A ‖ B)" in text and "the paths part" in text and "| x |" in text  # the figures and the keys
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, HelpScreen)


async def test_compare_from_the_journeys_palette_runs_on_its_model_and_escape_returns():
    from apptools import make_app, settle, wait_for

    from tokenviz.ui.keys import palette_entries

    assert ("Compare with other settings, side by side, on this model", "compare") in palette_entries()
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("space")
        before = await settle(app, pilot)
        for typed, error in (("temprature=2", "is not NAME=VALUE"), ("temperature=0", "to differ")):
            await type_comparison(app, pilot, typed)
            await wait_for(lambda e=error: any(e in str(n.message) for n in app._notifications), pilot)
            assert app.screen is app.journey  # refused in one line: the journey stays
        await type_comparison(app, pilot, "temperature=2 top-k=0")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), pilot)
        c = await settled(app, pilot)
        assert "greedy" in str(app.screen.query_one("#label-a").render())
        assert "T 2" in str(app.screen.query_one("#label-b").render())
        comparison = app.screen.worker.comparison
        assert comparison.a.engine.model is app.journey.worker.session.engine.model  # the same weights, loaded once
        assert comparison.a.prompt_ids == app.journey.worker.session.prompt_ids
        await pilot.press("space", "space")
        c = await settled(app, pilot)
        assert len(c.diffs) == 3
        await pilot.press("minus")  # the pace keys: autoplay at its pace, as in the journey
        c = await settled(app, pilot)
        assert c.pace_s > 0
        assert app.screen.check_action("back", ()) is True  # the footer says Escape goes back
        await pilot.press("escape")
        await wait_for(lambda: app.screen is app.journey, pilot)
        after = await settle(app, pilot)
        assert after.chips == before.chips and after.records == before.records  # the journey as it was


async def test_a_recording_has_no_model_to_compare_with():
    from apptools import frozen_recording, recorded_app, wait_for

    app = recorded_app(frozen_recording())
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(lambda: app.journey.snapshot is not None, pilot)
        await type_comparison(app, pilot, "temperature=2")
        await wait_for(lambda: any("recording" in str(n.message) for n in app._notifications), pilot)
        assert app.screen is app.journey


async def test_the_headers_state_every_difference_first_and_marked_and_so_does_the_json():
    """A grammar, a quantization or an intervention that sets B apart shows in both headers, marked,
    before what the two share; compare --json carries the same fields under "differences"."""
    from tokenviz.contract.grammar import Grammar
    from tokenviz.contract.interventions import HeadAblation
    from tokenviz.files.documents import comparison_document, setup_differences

    grammar = Grammar("regex", " (Paris|Rome)\\.", " (Paris|Rome)\\.")

    def build(progress):
        loaded = tiny_model()
        a = Session(ModelRunner(loaded), SamplingSettings(temperature=0))
        b = Session(ModelRunner(loaded), SamplingSettings(temperature=0, grammar=grammar))
        b.set_interventions([HeadAblation(0, 1)], context=[1, 2, 3])
        return Comparison(a, b)

    app = TokenvizApp(CompareWorker(build, PROMPT), comparing=True)
    async with app.run_test(size=(200, 40)) as pilot:
        c = await settled(app, pilot)
        differences = setup_differences(c.a, c.b)
        assert set(differences) == {"grammar", "interventions"}
        assert differences["grammar"] == ("none", grammar.label) and differences["interventions"][0] == "none"
        for side in ("a", "b"):
            label = str(app.query_one(f"#label-{side}").render())
            assert label.index("≠ grammar") < label.index("≠ interventions") < label.index("model ")
            assert "≠ seed" not in label  # what they share: unmarked, where it fits (whole fields, then …)
            assert "seed 0" in label or label.endswith(" · …")
        assert grammar.label in str(app.query_one("#label-b").render())
        document = comparison_document(c.a, c.b, c.diffs)
        assert document["differences"] == {name: list(values) for name, values in differences.items()}


async def test_an_infinite_kl_is_explained_where_it_is_shown():
    """A greedy B against a sampling A: B's final distribution is one token, so KL(A ‖ B) is infinite;
    the diff pane says why under its table instead of leaving a bare ∞."""
    from tokenviz.ui.compare_screen import INFINITE_KL

    def build(progress):
        loaded = tiny_model()
        hot = SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, seed=5)
        return Comparison(
            Session(ModelRunner(loaded), hot), Session(ModelRunner(loaded), SamplingSettings(temperature=0))
        )

    app = TokenvizApp(CompareWorker(build, PROMPT), comparing=True)
    async with app.run_test(size=(140, 40)) as pilot:
        c = await settled(app, pilot)
        assert any(d.final_kl == float("inf") for d in c.diffs)
        shown = str(app.query_one(DiffPane).render())
        assert "∞" in shown and INFINITE_KL.strip() in " ".join(shown.split())


async def test_a_comparison_from_a_journey_under_interventions_says_both_sides_run_under_them():
    """The journey's interventions are hooked into the weights both sides share: each side's numbers
    are the intervened model's, and the headers and the next-token panes say so."""
    from apptools import make_app, settle, wait_for

    from tokenviz.contract.commands import Intervene
    from tokenviz.contract.interventions import Steering
    from tokenviz.ui.panes.next_token import NextTokenPane

    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        steering = Steering(layer=1, scale=8.0, toward="the", away="a")
        app.journey.submit(Intervene(((steering, True),)))
        s = await settle(app, pilot)
        assert s.pending.interventions == (steering,)
        await type_comparison(app, pilot, "temperature=2 top-k=0")
        await wait_for(lambda: isinstance(app.screen, CompareScreen), pilot)
        c = await settled(app, pilot)
        a_pending = c.a.pending
        assert a_pending.interventions == (steering,)
        assert [x.id for x in a_pending.top] == [x.id for x in s.pending.top]  # the journey's intervened step
        assert all(abs(x.prob - y.prob) < 1e-5 for x, y in zip(a_pending.top, s.pending.top))
        for side in ("a", "b"):
            header = str(app.screen.query_one(f"#label-{side}").render())
            assert "interventions steer L1 ×8" in header and not header.rstrip().endswith("·")  # (briefly where long)
            assert "under interventions" in str(app.screen.query_one(f"#next-{side}", NextTokenPane).border_subtitle)


def test_a_header_says_each_intervention_briefly_by_its_own_label():
    """Briefly, each intervention is its kind, layer and size, whatever its texts hold (a ", " in a
    steering text had split one label in two when the joined list was split again)."""
    from tokenviz.contract.interventions import HeadAblation, Steering, briefly

    said = briefly((Steering(layer=1, scale=8.0, toward="Paris, France", away="a"), HeadAblation(0, 1)))
    assert said == "steer L1 ×8…, ablate L0.H1 (zero)", said


async def test_each_side_shows_its_final_distribution_beside_the_raw_one():
    """Issue 69, finding 6: both next-token panes showed the same raw distribution, so until the paths part
    the only difference on screen was "KL final". Each side's pane gives every followed candidate's final
    p: greedy's one-hot on A, the hot temperature's flattened distribution on B."""
    from apptools import text_of

    from tokenviz.ui.panes.next_token import NextTokenPane

    app = compare_app()
    async with app.run_test(size=(120, 36)) as pilot:
        c = await settled(app, pilot)
        for side, s in (("a", c.a), ("b", c.b)):
            lines = text_of(app.query_one(f"#next-{side}", NextTokenPane)).splitlines()
            assert "raw p" in lines[0] and "final p" in lines[0], lines
            d = s.records[-1].decision
            final = dict(zip((i for i, _ in d.watch), d.final_probs, strict=True))
            for candidate in s.records[-1].top[:3]:
                row = next(line for line in lines if f" {candidate.id} " in line)
                after = final[candidate.id]
                said = "—" if after == 0 else probability(after, 7).strip()
                assert said in row.split(probability(candidate.prob, 7).strip(), 1)[1], (side, row)
        a_rows = text_of(app.query_one("#next-a", NextTokenPane))
        assert "1.000" in a_rows and a_rows.count("—") >= 2  # greedy: the argmax certain, the rest dropped


async def test_p_and_shift_p_move_the_cursor_between_the_steps_where_the_top_1s_differ():
    """Two models (one tokenizer): p puts the cursor on each step whose top-1s differ in turn, P back; past
    the last, a notification says none is left; the pane's first line is the steps in llama-perplexity's
    terms (the comparison's own statistics) and ▲ marks each such step under the chart."""
    from apptools import wait_for

    def build(progress):
        # A tiny model's top-1 is its last token (tied embeddings): B's head is A's untied with noise added,
        # so the two top-1s agree at some steps and differ at others (sampled hot, on A's varied path).
        a = tiny_model()
        b = copy.deepcopy(a)
        torch.manual_seed(0)
        head = a.model.get_output_embeddings().weight.detach()
        b.model.lm_head.weight = torch.nn.Parameter(head + torch.randn_like(head) * head.std() * 2.0)
        hot = SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, seed=3, max_new_tokens=10)
        return Comparison(Session(ModelRunner(a), hot), Session(ModelRunner(b), hot))

    app = TokenvizApp(CompareWorker(build, PROMPT), comparing=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot)
        await pilot.press(*["space"] * 9)
        c = await settled(app, pilot)
        screen = app.screen
        differ = [d.index for d in c.diffs if not d.top1_agree]
        assert len(differ) >= 2, "the two tiny models' top-1s differ too rarely to test the key"
        shown = str(screen.query_one(DiffPane).render())
        assert f"same top {c.statistics['same_top_p']:.1%}" in shown and "mean KLD" in shown
        marks = next(line for line in shown.splitlines() if line.startswith("top-1s differ"))
        assert marks.count("▲") == len(differ)
        for step in differ:
            await pilot.press("p")
            await wait_for(lambda step=step: screen.cursor == c.a.prompt_len + step - 1, pilot)
        await pilot.press("P")
        await wait_for(lambda: screen.cursor == c.a.prompt_len + differ[-2] - 1, pilot)
        await pilot.press("p", "p")
        await wait_for(lambda: any("do not differ after step" in str(n.message) for n in app._notifications), pilot)


async def test_before_any_step_the_pane_says_so_not_that_the_paths_have_not_parted():
    """UX 7's finding 19: while loading, the pane said "the paths have not parted: both chose the same token at
    every step", before either had chosen anything."""
    import threading

    from apptools import wait_for

    loading = threading.Event()

    def build(progress):
        progress("loading the tiny models", None)
        loading.wait(30)
        loaded = tiny_model()
        greedy = SamplingSettings(temperature=0)
        return Comparison(Session(ModelRunner(loaded), greedy), Session(ModelRunner(loaded), greedy))

    app = TokenvizApp(CompareWorker(build, PROMPT), comparing=True)
    async with app.run_test(size=(120, 36)) as pilot:
        pane = app.screen.query_one(DiffPane)
        await wait_for(lambda: "no step yet" in str(pane.render()), pilot)
        assert "have not parted" not in str(pane.render())
        loading.set()
        await wait_for(lambda: "have not parted" in str(pane.render()), pilot, timeout=60)
