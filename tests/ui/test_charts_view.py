"""The charts view plots the journey's own figures: entropy and the chosen token's probability by
step, the watched tokens, the prompt's surprisal, decode time and the KV cache; long series are
thinned to what a chart can show, the newest point always kept."""

from apptools import make_app, settle

from tokenviz.contract.commands import Watch
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.charts import MAX_POINTS, thinned


async def test_c_charts_the_journeys_own_figures():
    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=40))
    async with app.run_test(size=(160, 44)) as pilot:
        await settle(app, pilot)
        app.journey.submit(Watch(42))
        await pilot.press(*["space"] * 6, "C")
        s = await settle(app, pilot)
        assert app.query_one("#views").current == "charts"
        series = app.query_one("#charts").series
        records = s.records
        (_, steps, entropy), (_, _, chosen) = series["entropy"]
        assert steps == [float(r.index) for r in records] and entropy == [r.entropy for r in records]
        assert chosen == [r.decision.chosen_prob for r in records]
        ((label, _, watched),) = series["watched"]
        assert label == s.pinned[0][1] and watched == [r.decision.pinned[0].prob for r in records]
        ((_, positions, bits),) = series["surprisal"]
        predictions = records[0].prompt_predictions
        assert positions == [float(p.position + 1) for p in predictions] and bits == [p.surprisal for p in predictions]
        ((_, context, ms),) = series["decode"]
        assert context == [float(r.kv_len) for r in records[1:]] and ms == [r.forward_ms for r in records[1:]]
        ((_, tokens, mb),) = series["cache"]
        assert tokens == [float(r.kv_len) for r in records] and mb == [r.kv_bytes / 2**20 for r in records]
        await pilot.press("C")  # again: back to the attention map
        await settle(app, pilot)
        assert app.query_one("#views").current == "attention"


def test_long_series_are_thinned_evenly_keeping_the_newest():
    xs = [float(i) for i in range(10_000)]
    tx, ty = thinned(xs, [x * 2 for x in xs])
    assert len(tx) <= MAX_POINTS and tx[-1] == 9999.0 and ty == [x * 2 for x in tx]
    assert thinned([1.0, 2.0], [3.0, 4.0]) == ([1.0, 2.0], [3.0, 4.0])
