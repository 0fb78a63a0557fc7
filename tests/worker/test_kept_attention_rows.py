"""The engine keeps the attention pane's rows between snapshots: what it shows equals computing the
whole window again, after steps, a rewind, a branch and a layer change."""

import numpy as np
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.attention import causal_view
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.worker.attention_rows import AttentionRows


def test_kept_rows_equal_the_whole_window_computed_again():
    session = Session(ModelRunner(tiny_model()), SamplingSettings(seed=2))
    session.start("The Eiffel Tower is located in")
    rows = AttentionRows()
    computed = []
    original = session.attention
    session.attention = lambda queries, layers, cancelled=None: computed.append(queries) or original(queries, layers)

    def check(layer: int, window: int = 6) -> None:
        n = session.engine.kv_len
        queries = range(max(n - window, 0), n)
        shown = rows.view(session, layer, queries)
        whole = causal_view(layer, queries, original(queries, [layer])[0])
        assert shown.queries == whole.queries
        np.testing.assert_allclose(shown.weights, whole.weights, atol=1e-6)

    check(1)
    for _ in range(3):
        session.step()
        computed.clear()
        check(1)
        assert computed == [range(session.engine.kv_len - 1, session.engine.kv_len)]  # the new row alone
    session.rewind()
    check(1)
    session.step(forced_id=7)  # a branch: the last row differs from what was kept
    check(1)
    check(0)  # another layer
