"""An SAE's features in the app: E loads one (a folder) beside the model and F shows what it reads in the
residual at the cursor, each activation its encode of the residual transformers computes there; the
interventions dialog steers and clamps one of its features live, the pending token re-decided with the
model's own distribution beside it; w follows a feature (feature:SAE:ID) at each position up to the cursor;
a folder that holds no SAE is one line and the journey goes on."""

from __future__ import annotations

import pytest
import torch
from apptools import answer_dialog, make_app, settle, wait_for
from sae_folders import saelens_sae
from textual.widgets import Input

from tokenviz.contract.commands import LabelFeatures, ReadFeatures
from tokenviz.contract.interventions import FeatureClamp, FeatureSteering
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.feature_readings import features_at
from tokenviz.render.visible import visible
from tokenviz.ui.panes.charts import ChartsPane
from tokenviz.ui.panes.features import FeaturesPane
from tokenviz.ui.screens import InterventionsDialog, SaeDialog, WatchScreen

pytestmark = pytest.mark.features
LAYER = 1


async def add_sae(app, pilot, folder: str) -> None:
    await pilot.press("E")
    await wait_for(lambda: isinstance(app.screen, SaeDialog), pilot)
    app.screen.query_one(Input).value = folder
    await pilot.press("enter")


def residual_at(app, ids: list[int], position: int) -> torch.Tensor:
    """The residual after LAYER at `position`, from transformers' own pass over `ids` (no tokenviz code)."""
    model = app.journey.worker.session.engine.model
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER + 1][0, position].float()


async def test_e_adds_an_sae_and_f_shows_its_encode_of_the_residual_at_the_cursor(tmp_path):
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        s = await settle(app, pilot)
        folder = saelens_sae(tmp_path / "sae-a", "jumprelu", s.info.hidden, 2, LAYER)
        await add_sae(app, pilot, str(folder))
        await wait_for(lambda: (r := app.journey.snapshot.result(ReadFeatures)) is not None and r.readings, pilot)
        s = await settle(app, pilot)
        read = s.result(ReadFeatures)
        (reading,) = read.readings
        ids = [chip.id for chip in s.chips[: read.position + 1]]
        from tokenviz.features.sae_folder import read_saes

        (sae,) = read_saes(folder)
        theirs = sae.encode(residual_at(app, ids, read.position)[None])[0]  # the SAE's encode, of transformers'
        active = torch.nonzero(theirs > 0).flatten().tolist()
        assert reading.l0 == len(active) > 0 and {f.id for f in reading.features} == set(active)
        for f in reading.features:
            assert f.activation == pytest.approx(float(theirs[f.id]), rel=1e-4, abs=1e-5)
        shown = str(app.query_one(FeaturesPane).body.render())
        assert f"sae-a L{LAYER}" in shown and f"#{reading.features[0].id}" in shown and f"L0 {reading.l0}" in shown
        # then each feature shown is labelled by the tokens it promotes (a second request, after the frame)
        await wait_for(
            lambda: (labels := app.journey.snapshot.result(LabelFeatures)) is not None and labels.labels, pilot
        )
        label = app.journey.snapshot.result(LabelFeatures).label_of("sae-a", reading.features[0].id)
        assert label is not None and len(label.promotes) == 5
        said = "↑" + visible(label.promotes[0])
        await wait_for(lambda: said in str(app.query_one(FeaturesPane).body.render()), pilot)
        await pilot.press("left")  # the cursor moves: the view reads the position it is on
        moved = read.position - 1
        await wait_for(lambda: (r := app.journey.snapshot.result(ReadFeatures)) and r.position == moved, pilot)


async def test_the_interventions_dialog_steers_and_clamps_a_feature_live(tmp_path):
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        before = await settle(app, pilot)
        folder = saelens_sae(tmp_path / "sae-b", "standard", before.info.hidden, 3, LAYER)
        await add_sae(app, pilot, str(folder))
        await settle(app, pilot)
        await answer_dialog(app, pilot, "I", InterventionsDialog, "sae-steer sae-b:4:30")
        s = await settle(app, pilot)
        steering = FeatureSteering("sae-b", 4, 30.0, LAYER, str(folder.resolve()))
        assert s.interventions == ((steering, True),) and s.pending.interventions == (steering,)
        assert s.pending.unsteered is not None and s.pending.unsteered.kl > 0
        own, plain = s.pending.unsteered.top, before.pending.top  # the model's own beside: what it said before
        assert [c.id for c in own] == [c.id for c in plain]
        await answer_dialog(app, pilot, "I", InterventionsDialog, "sae-clamp sae-b:4:0")
        s = await settle(app, pilot)
        clamp = FeatureClamp("sae-b", 4, 0.0, LAYER, str(folder.resolve()))
        assert s.interventions == ((steering, True), (clamp, True)) and s.pending.interventions == (steering, clamp)
        await answer_dialog(app, pilot, "I", InterventionsDialog, "sae-clamp nope:1:2")
        await wait_for(lambda: any("no SAE named 'nope'" in str(n.message) for n in app._notifications), pilot)
        assert (await settle(app, pilot)).interventions == ((steering, True), (clamp, True))


async def test_a_folder_without_an_sae_is_one_line_and_the_journey_goes_on(tmp_path):
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(80, 24)) as pilot:
        before = await settle(app, pilot)
        await add_sae(app, pilot, str(tmp_path))
        await wait_for(lambda: any("holds no SAE" in str(n.message) for n in app._notifications), pilot)
        await pilot.press("space")
        s = await settle(app, pilot)
        assert len(s.records) == len(before.records) + 1


async def test_w_follows_a_feature_at_every_step_in_the_view_and_the_charts(tmp_path):
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(80, 24)) as pilot:
        s = await settle(app, pilot)
        folder = saelens_sae(tmp_path / "sae-c", "jumprelu", s.info.hidden, 2, LAYER)
        await add_sae(app, pilot, str(folder))
        await settle(app, pilot)
        strongest = app.journey.snapshot.result(ReadFeatures).readings[0].features[0]
        await answer_dialog(app, pilot, "w", WatchScreen, f"feature:sae-c:{strongest.id}")
        await wait_for(lambda: app.journey.snapshot.watched_features, pilot)
        s = await settle(app, pilot)
        (watched,) = s.watched_features
        steps = range(s.prompt_len - 1, len(s.chips))  # each step's position, the pending one's included
        assert (watched.sae, watched.id, watched.positions) == ("sae-c", strongest.id, tuple(steps))
        assert watched.activations[-1] == pytest.approx(strongest.activation, rel=1e-4, abs=1e-6)
        await wait_for(lambda: f"★ sae-c#{strongest.id}" in str(app.query_one(FeaturesPane).body.render()), pilot)
        await pilot.press("space", "space")  # a step reads its own position: the series grows by one each
        s = await settle(app, pilot)
        (after,) = s.watched_features
        assert len(after.positions) == len(watched.positions) + 2
        assert after.activations[: len(watched.activations)] == pytest.approx(watched.activations, rel=1e-4, abs=1e-6)
        read = features_at(app.journey.worker.session, after.positions[-1])  # the view's own reading there
        shown = {f.id: f.activation for f in read.readings[0].features}
        assert after.activations[-1] == pytest.approx(shown.get(strongest.id, 0.0), rel=1e-4, abs=1e-6)
        await pilot.press("C")  # the charts: its line by step
        charts = app.query_one(ChartsPane)
        await wait_for(lambda: charts.series.get("features"), pilot)
        ((label, xs, ys),) = charts.series["features"]
        assert label == f"sae-c#{strongest.id}" and xs == [float(i) for i in range(len(after.positions))]
        assert ys == list(after.activations)
        await answer_dialog(app, pilot, "w", WatchScreen, f"feature:sae-c:{strongest.id}")  # again: not followed
        await wait_for(lambda: not app.journey.snapshot.watched_features, pilot)
