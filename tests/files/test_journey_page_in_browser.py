"""The HTML page of a journey in a real browser, offline: clicking the 5th generated token shows that
step's top candidate with the probability recorded in the journey, the attention heatmap is drawn,
the arrow keys move between steps, and the page fetched nothing."""

import json
import time
from pathlib import Path

from apptools import frozen_recording
from browser import SCREENSHOTS, chips_of, chromium, needs_browser, until
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tokenviz.files.journey_page import save_page
from tokenviz.ui.colors import page_colors
from tokenviz.ui.themes import DEFAULT_THEME, load_themes
from tokenviz.worker.snapshots import saved_attention_of


@needs_browser
def test_the_page_shows_each_step_as_recorded_offline(tmp_path):
    snapshot, attention, _ = frozen_recording(steps=8)
    path = save_page(tmp_path / "journey.html", snapshot, attention, page_colors(load_themes()[DEFAULT_THEME]))
    fifth = snapshot.records[4]  # the step that chose the 5th generated token
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        chips = chips_of(browser, len(snapshot.chips))
        assert len(chips) == len(snapshot.chips)
        chips[snapshot.prompt_len + 3].click()  # as in the app, a token shows the step made after it
        heading = until(lambda: browser.find_element(By.CSS_SELECTOR, "#step h2").text)
        assert heading.startswith("step 5:")  # numbered as the app numbers it: the 5th token generated
        assert f"at position {snapshot.prompt_len + 3}" in heading and "pending" not in heading
        first = browser.find_element(By.CSS_SELECTOR, "#step tr:nth-child(2)")
        assert first.find_element(By.CSS_SELECTOR, "td.raw").text == f"{fifth.top[0].prob:.4f}"
        assert first.find_element(By.CSS_SELECTOR, "td.tok").text.replace("·", " ") == fifth.top[0].text
        until(lambda: browser.execute_script("return document.getElementById('heatmap').width") > 10)
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
        assert until(lambda: browser.find_element(By.CSS_SELECTOR, "#step h2").text).startswith("step 6:")
        chips[-1].click()  # the newest token: the step pending after it, which no chip chose yet
        pending = until(lambda: browser.find_element(By.CSS_SELECTOR, "#step h2").text)
        # (issue 69, finding 14: it said "step 8" where the app's status said "step 7": the step to come)
        assert pending.startswith(f"pending, after step {len(snapshot.chips) - snapshot.prompt_len}:"), pending
        assert "computed, not taken yet" in pending
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        if SCREENSHOTS:
            browser.save_screenshot(str(Path(SCREENSHOTS) / "html-page.png"))


@needs_browser
def test_the_page_opens_where_the_app_was_with_a_scale_and_holds_at_800_px(tmp_path):
    from tokenviz.contract.commands import PageView

    snapshot, attention, _ = frozen_recording(steps=8)
    cursor = snapshot.prompt_len + 2
    view = PageView(layer=1, head="2", cursor=cursor)
    path = save_page(tmp_path / "j.html", snapshot, attention, page_colors(load_themes()[DEFAULT_THEME]), view)
    with chromium(width=800, height=900) as browser:
        browser.get(path.resolve().as_uri())
        until(lambda: browser.execute_script("return document.getElementById('heatmap').width") > 10)
        assert browser.execute_script("return document.getElementById('layer').value") == "1"
        assert browser.execute_script("return document.getElementById('head').value") == "2"
        selected = browser.find_element(By.CSS_SELECTOR, ".chip.sel")
        assert selected.get_attribute("data-index") == str(cursor)
        # The step the app shows at its cursor: the one made after the cursor's token.
        assert browser.find_element(By.CSS_SELECTOR, "#step h2").text.startswith("step 4:")
        ramp = browser.execute_script("return getComputedStyle(document.getElementById('ramp')).backgroundImage")
        assert ramp.startswith("linear-gradient")  # the heatmap's colour scale
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        header = browser.find_element(By.TAG_NAME, "header").text
        assert header.count(snapshot.info.name) == 1  # the model's name once
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@needs_browser
def test_a_200_step_journey_of_the_bundled_model_makes_a_page_under_2_mb(bundled, tmp_path):
    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import saved_attention_of, snapshot_of

    session = Session(ModelRunner(bundled), SamplingSettings(seed=3, max_new_tokens=200))
    session.start("The Eiffel Tower is located in")
    session.pin([session.engine.encode(" Paris")[0]])
    eos = session.engine.eos_ids
    while len(session.generated_ids) < 200:  # past the end of text: the best other candidate instead
        pending = session.records[-1]
        if pending.decision.chosen_id in eos:
            session.step(forced_id=next(c.id for c in pending.top if c.id not in eos))
        else:
            session.step()
    snapshot = snapshot_of(session)
    assert len(snapshot.chips) - snapshot.prompt_len == 200
    path = save_page(
        tmp_path / "bundled.html", snapshot, saved_attention_of(session), page_colors(load_themes()[DEFAULT_THEME])
    )
    assert path.stat().st_size < 2_000_000
    with chromium(1280, 1000) as browser:
        browser.get(path.resolve().as_uri())
        chips = chips_of(browser, len(snapshot.chips))
        chips[snapshot.prompt_len + 3].click()  # (the step made after it: the 5th)
        first = browser.find_element(By.CSS_SELECTOR, "#step tr:nth-child(2)")
        assert first.find_element(By.CSS_SELECTOR, "td.raw").text == f"{snapshot.records[4].top[0].prob:.4f}"
        until(lambda: browser.execute_script("return document.getElementById('heatmap').width") > 10)
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        if SCREENSHOTS:  # the step and its attention, below the 200 tokens
            browser.execute_script("document.querySelector('main').scrollIntoView()")
            time.sleep(0.3)
            browser.save_screenshot(str(Path(SCREENSHOTS) / "html-page-bundled.png"))


@needs_browser
def test_a_theme_with_fewer_than_two_valid_heatmap_stops_falls_back_to_the_default(tmp_path):
    from tokenviz.files.journey_page import DEFAULT_HEATMAP

    snapshot, attention, _ = frozen_recording(steps=3)
    colors = dict(page_colors(load_themes()[DEFAULT_THEME]))
    colors["heatmap"] = ("#112233", "url(https://example.invalid/x)", "#12345g")  # one valid stop of three
    path = save_page(tmp_path / "one-stop.html", snapshot, attention, colors)
    assert '"heatmap":' + json.dumps(list(DEFAULT_HEATMAP), separators=(",", ":")) in path.read_text()
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        until(lambda: browser.execute_script("return document.getElementById('heatmap').width") > 10)
        painted = browser.execute_script(
            "const c = document.getElementById('heatmap');"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;"
        )
        assert painted > 0  # drawn, in the default colours
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@needs_browser
def test_the_page_says_which_interventions_were_in_force_and_shows_the_models_own_distribution(tmp_path):
    """A steered journey's page must not pass the steered choice off as the model's own: each step
    names the interventions in force and shows the model's own top candidates and the KL beside them."""
    from tiny import tiny_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.interventions import HeadAblation
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0))
    session.start("The cat sat on the mat. The dog")
    session.set_interventions([HeadAblation(0, 1), HeadAblation(1, 0)])
    session.step()
    snapshot = snapshot_of(session)
    path = save_page(
        tmp_path / "steered.html", snapshot, saved_attention_of(session), page_colors(load_themes()[DEFAULT_THEME])
    )
    first = snapshot.records[0]
    assert first.unsteered is not None
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        chips = chips_of(browser, len(snapshot.chips))
        chips[snapshot.prompt_len - 1].click()  # (the last prompt token: the first step, made after it)
        step = until(lambda: browser.find_element(By.ID, "step").text)
        assert step.startswith("step 1:")
        assert "interventions in force: " + "; ".join(i.label for i in first.interventions) in step
        assert f"KL from it: {first.unsteered.kl:.3f} bits" in step
        own_rows = browser.find_elements(By.CSS_SELECTOR, "#step table")[1].find_elements(By.CSS_SELECTOR, "td.raw")
        assert own_rows[0].text == f"{first.unsteered.top[0].prob:.4f}"
        assert "interventions" in browser.find_element(By.ID, "facts").text
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@needs_browser
def test_the_page_of_a_stopped_journey_opens_on_its_last_step(tmp_path):
    """Issue 69, finding 10: a stopped journey's page opened on its last token, after which no step was
    made ("no prediction after this token was kept", an empty panel); it opens, as the app does, on the
    last step, the one that chose that token."""
    from tiny import tiny_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, max_new_tokens=4))
    session.start("The cat sat on the mat")
    while session.stop_reason is None:
        session.step()
    snapshot = snapshot_of(session)
    path = save_page(
        tmp_path / "stopped.html", snapshot, saved_attention_of(session), page_colors(load_themes()[DEFAULT_THEME])
    )
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        heading = until(lambda: browser.find_element(By.CSS_SELECTOR, "#step h2").text)
        assert heading.startswith("step 4:") and "pending" not in heading, heading
        assert browser.find_element(By.CSS_SELECTOR, ".chip.sel").get_attribute("data-index") == str(
            len(snapshot.chips) - 2
        )


@needs_browser
def test_the_page_says_off_and_dropped_as_the_app_does(tmp_path):
    """Issue 69, finding 14: the page said "top-k 0" where the app says "top-k off", and "0.0000" for a
    token a stage dropped where the app shows "—"."""
    import dataclasses

    snapshot, attention, _ = frozen_recording(steps=4)
    snapshot = dataclasses.replace(snapshot, settings=snapshot.settings.replace(top_k=0))
    path = save_page(tmp_path / "off.html", snapshot, attention, page_colors(load_themes()[DEFAULT_THEME]))
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        facts = until(lambda: browser.find_element(By.ID, "facts").text)
        assert "top-k off" in facts and "top-k 0" not in facts, facts
        finals = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#step td.final")]
        assert "—" in finals and "0.0000" not in finals, finals


@needs_browser
def test_the_page_shows_the_lens_where_the_journey_has_it(tmp_path):
    """Issue 69, finding 10: the page had no lens. A step whose position the lens was computed at shows
    each layer's top-1 and the chosen token's rank and p, as computed; a step without one shows none."""
    from tiny import tiny_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.results import lens_row_label
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import snapshot_of

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0))
    session.start("The cat sat on the mat")
    for _ in range(3):
        session.step()
    at = len(session.prompt_ids)  # (the second step's position: after the first generated token)
    inspection = session.analyses.inspect(at)
    snapshot = snapshot_of(session)
    colors = page_colors(load_themes()[DEFAULT_THEME])
    path = save_page(tmp_path / "lens.html", snapshot, saved_attention_of(session), colors, lens=[inspection])
    with chromium() as browser:
        browser.get(path.resolve().as_uri())
        chips = chips_of(browser, len(snapshot.chips))
        chips[at].click()
        rows = until(lambda: browser.find_elements(By.CSS_SELECTOR, "#step .lens tr")[1:])
        assert len(rows) == len(inspection.lens)
        cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
        # (one numbering with the app's: the last row follows the last layer, counted from 0; the page said L{row})
        assert cells[0][0] == "emb" and cells[-1][0] == f"L{inspection.lens[-1].layer - 1}" == lens_row_label(
            inspection.lens[-1].layer
        )
        for shown, layer in zip(cells, inspection.lens):
            assert shown[2:] == [f"{layer.top[0][2]:.4f}", str(layer.chosen_rank), f"{layer.chosen_prob:.4f}"]
        chips[at + 1].click()  # (a step the lens was not computed for)
        until(lambda: browser.find_element(By.CSS_SELECTOR, "#step h2").text.startswith("step 3:"))
        assert not browser.find_elements(By.CSS_SELECTOR, "#step .lens")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@needs_browser
def test_the_page_of_a_trace_with_an_sae_shows_each_steps_features(tmp_path, monkeypatch, capsys):
    """trace --sae DIR --html: a step's card shows what the SAE read at the position that made it, as the
    trace's document has it (its L0, each feature's activation and share, the tokens it promotes)."""
    from clitools import invoke
    from sae_folders import saelens_sae
    from tiny import save_tiny

    model = save_tiny(tmp_path / "tiny", "llama", context=64)
    hidden = json.loads((Path(model) / "config.json").read_text())["hidden_size"]
    sae = saelens_sae(tmp_path / "sae-p", "jumprelu", hidden, 6, 1)
    page = tmp_path / "sae.html"
    args = ["trace", "The cat sat on the mat", "--model", model, "--steps", "3", "--temperature", "0", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args, "--sae", str(sae), "--html", str(page))
    assert code == 0, err
    doc = json.loads(out)
    step = doc["steps"][1]
    (reading,) = step["sae"]
    labels = {label["id"]: label for label in doc["sae_labels"]}
    with chromium() as browser:
        browser.get(page.resolve().as_uri())
        chips = chips_of(browser, len(doc["prompt"]) + 3)
        chips[step["position"]].click()
        heading = until(lambda: [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#step .lens h3")])
        assert heading == [f"SAE sae-p, the residual after layer 1: L0 {reading['l0']}, error {reading['error']:.1%}"]
        rows = browser.find_elements(By.CSS_SELECTOR, "#step .lens tr")[1:]
        cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
        assert len(cells) == min(12, len(reading["features"]))
        for shown, feature in zip(cells, reading["features"]):
            promotes = " ".join(t.replace(" ", "·") for t in labels[feature["id"]]["promotes"])
            assert shown == [f"#{feature['id']}", f"{feature['activation']:.3f}", f"{feature['share']:.1%}", promotes]
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
