"""A served model's numbers said for what they are on the status line: a request's time (network
included), not a forward pass; no KV cache, which the server keeps to itself (never "0 B")."""

from __future__ import annotations

import pytest
from hostile_server import hostile_server

from tokenviz.served.endpoint import ApiKey

KEY_ENV = "TOKENVIZ_LABELS_KEY"


@pytest.mark.parametrize("size", [(200, 60), (80, 24)])
async def test_the_status_line_of_a_served_model_says_request_and_no_kv_cache(monkeypatch, size):
    from apptools import settle

    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.served.journey import ServedChoice
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.status import StatusLine
    from tokenviz.worker.engine import EngineWorker

    monkeypatch.setenv(KEY_ENV, "labels-key")
    with hostile_server() as server:
        engine = ServedEngine.open(ServedChoice(server.url, api_key=ApiKey(env=KEY_ENV)))
        app = TokenvizApp(EngineWorker(lambda progress: engine, SamplingSettings(temperature=0), "Hi"))
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await pilot.press("space")
            await settle(app, pilot)
            line = str(app.query_one(StatusLine).render())
            assert "step 1" in line and "fwd" not in line and "KV" not in line and " 0 B" not in line, line
            if size[0] >= 200:
                assert "request " in line and " ms" in line, line
