"""A served model's numbers said for what they are on the status line: a request's time (network
included), not a forward pass; no KV cache, which the server keeps to itself (never "0 B")."""

from __future__ import annotations

import pytest
from apptools import model_text
from browser import chips_of, chromium, needs_browser, until
from hostile_server import hostile_server

from tokenviz.backends.shared.endpoint import ApiKey

KEY_ENV = "TOKENVIZ_LABELS_KEY"


@pytest.mark.parametrize("size", [(200, 60), (80, 24)])
async def test_the_status_line_of_a_served_model_says_request_and_no_kv_cache(monkeypatch, size):
    from apptools import settle

    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.status import StatusLine
    from tokenviz.worker.engine_thread import EngineWorker

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


def served_page(tmp_path, monkeypatch):
    """The page of a three-step journey on a served model (the hostile server playing a tiny vLLM)."""
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.files.journey_page import save_page
    from tokenviz.journey.session import Session
    from tokenviz.ui.colors import page_colors
    from tokenviz.ui.themes import DEFAULT_THEME, load_themes
    from tokenviz.worker.snapshots import saved_attention_of, snapshot_of

    monkeypatch.setenv(KEY_ENV, "labels-key")
    with hostile_server() as server:
        engine = ServedEngine.open(ServedChoice(server.url, api_key=ApiKey(env=KEY_ENV)))
        session = Session(engine, SamplingSettings(temperature=0.7, seed=3))
        session.start("Hi")
        for _ in range(3):
            session.step()
        snapshot = snapshot_of(session)
    colors = page_colors(load_themes()[DEFAULT_THEME])
    return snapshot, save_page(tmp_path / "served.html", snapshot, saved_attention_of(session), colors)


def test_the_page_of_a_served_journey_says_what_the_app_says(tmp_path, monkeypatch):
    """Issue 51, item 2: no '0 layers', no KV chart at 0 MB, no forward time, and the footer says the
    numbers are the server's top N or made here from them."""
    snapshot, path = served_page(tmp_path, monkeypatch)
    html = path.read_text()
    assert snapshot.info.covers == 20 and snapshot.info.requests and snapshot.info.layers == 0
    assert "KV cache MB" not in html and "decode ms" not in html and "request ms against context" in html
    assert "every number is the one the model computed" not in html
    assert "one the server returned (its top 20 log-probabilities a step)" in html


@needs_browser
def test_the_served_page_in_a_browser_labels_the_top_n_and_the_entropy_floor(tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By

    snapshot, path = served_page(tmp_path, monkeypatch)
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        facts = until(lambda: browser.find_element(By.ID, "facts").text)
        assert "layers" not in facts and "heads" not in facts and "the server's top 20 log-probabilities" in facts
        chips = chips_of(browser, len(snapshot.chips))
        chips[snapshot.prompt_len - 1].click()  # (the last prompt token: the first step, made after it)
        summary = until(lambda: browser.find_element(By.CSS_SELECTOR, "#step p").text)
        assert "entropy ≥ " in summary, summary
        stages = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#step ol li")]
        assert stages[0].startswith("raw: the server's top 20 log-probabilities"), stages
        assert all("of the top 20's mass" in s for s in stages[1:] if "tokens kept" in s), stages
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def app_on(server, monkeypatch):
    """The app, greedy on "Hi", on the model `server` serves (a stub: no vllm-lens plugin)."""
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    monkeypatch.setenv(KEY_ENV, "labels-key")
    engine = ServedEngine.open(ServedChoice(server.url, api_key=ApiKey(env=KEY_ENV)))
    return TokenvizApp(EngineWorker(lambda progress: engine, SamplingSettings(temperature=0), "Hi"))


async def test_a_key_a_served_model_lacks_is_one_short_line_and_the_model_view_says_why(monkeypatch):
    """Issue 51, item 4: the lens on a server without vllm-lens answers in one short notification (it was
    five or six lines at 80 columns); M says what is not exposed and how to have it, and what never is."""
    from apptools import settle, wait_for

    with hostile_server() as server:
        app = app_on(server, monkeypatch)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("l")
            await wait_for(lambda: any("logit lens" in str(n.message) for n in app._notifications), pilot)
            line = next(str(n.message) for n in app._notifications if "logit lens" in str(n.message))
            assert "\n" not in line and len(line) < 100 and "(it gives:" not in line, line
            await pilot.press("M")
            pane = app.query_one("#model")
            await wait_for(lambda: "no logit lens" in model_text(pane), pilot)
            said = model_text(pane)
            assert "no vllm-lens plugin" in said and "pip install" in said and "a head's ablation" in said


async def test_the_footer_at_200x60_offers_no_key_a_served_model_lacks(monkeypatch):
    """Issue 51, item 4: the 200x60 footer of a served model offered `] layer± h head± l lens`."""
    from apptools import settle
    from textual.widgets._footer import FooterKey

    with hostile_server() as server:
        app = app_on(server, monkeypatch)
        async with app.run_test(size=(200, 60)) as pilot:
            await settle(app, pilot)
            await pilot.pause(0.3)
            offered = {key.description for key in app.screen.query(FooterKey)}
            assert "step" in offered or "play" in offered, offered  # (the footer is drawn)
            assert not offered & {"layer±", "head±", "lens", "KV cache"}, offered
