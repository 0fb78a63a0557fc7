"""The HTML page of a journey is self-contained and says what the journey recorded: no external URL,
every step's top candidate with its recorded probability, the attention kept within its budget; a
text from the model cannot break out of the page's data."""

import html
import json
import re

from apptools import frozen_recording

from tokenviz.contract.attention import SavedAttention
from tokenviz.files import journey_page as page_module
from tokenviz.files.journey_page import journey_page

COLORS = {
    "background": "#000000",
    "foreground": "#ffffff",
    "panel": "#1c1c1c",
    "primary": "#ffd700",
    "bar": "#56b4e9",
    "bar_final": "#ffd700",
    "chip_prompt": "#303030",
    "chip_generated": "#00315c",
    "chosen": "#ffd700",
    "heatmap": ["#00224e", "#fee838"],
}


def data_of(html: str) -> dict:
    raw = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1)
    return json.loads(raw)


def test_the_page_carries_every_step_as_recorded_and_no_external_url():
    snapshot, attention, _ = frozen_recording(steps=6)
    html = journey_page(snapshot, attention, COLORS)
    assert not re.search(r"(src|href)\s*=\s*[\"']?\s*(https?:)?//", html, re.I)
    assert "http://" not in html and "https://" not in html
    data = data_of(html)
    assert len(data["steps"]) == len(snapshot.records)
    for step, record in zip(data["steps"], snapshot.records, strict=True):
        assert step["top"][0][:3] == [record.top[0].id, record.top[0].text, record.top[0].prob]
        assert step["chosen"] == [record.decision.chosen_id, record.decision.chosen_text]
    kept = data["attention"]
    assert kept["positions"] == sorted(attention.rows) and kept["layers"] == snapshot.info.layers
    assert "<svg" in html  # the charts, inline


def test_a_models_text_cannot_break_out_of_the_data(monkeypatch):
    import dataclasses

    snapshot, attention, _ = frozen_recording(steps=2)
    chip = dataclasses.replace(snapshot.chips[0], text="</script><script>alert(1)</script>")
    snapshot = dataclasses.replace(snapshot, chips=(chip, *snapshot.chips[1:]))
    html = journey_page(snapshot, attention, {**COLORS, "bar": "red;} body{display:none"})
    assert "<script>alert" not in html and html.count("</script>") == 2
    assert data_of(html)["chips"][0][1] == chip.text  # the text itself is kept, as data
    assert "display:none" not in html


def test_the_attention_kept_fits_its_budget(monkeypatch):
    snapshot, attention, _ = frozen_recording(steps=6)
    monkeypatch.setattr(page_module, "ATTENTION_BYTES", 300)
    kept = data_of(journey_page(snapshot, attention, COLORS))["attention"]
    assert kept is None or (
        len(kept["positions"]) < len(attention.rows) and kept["positions"][-1] == max(attention.rows)
    )
    assert data_of(journey_page(snapshot, SavedAttention(), COLORS))["attention"] is None


def test_trace_html_writes_the_page_and_refuses_to_replace_one(tmp_path, monkeypatch, capsys):
    from clitools import invoke
    from tiny import save_tiny

    model = save_tiny(tmp_path / "tiny")
    page = tmp_path / "journey.html"
    args = ("trace", "The Eiffel Tower", "--model", model, "--steps", "3", "--html", str(page))
    code, out, err = invoke(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    data = data_of(page.read_text())
    assert [s["chosen"][0] for s in data["steps"][:3]] == [s["chosen"]["id"] for s in doc["steps"]]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and "exists already" in err


def test_trace_lens_html_puts_each_steps_lens_on_the_page(tmp_path, monkeypatch, capsys):
    """Issue 69, finding 10: `trace --lens --html` made a page with no lens. Each step's lens is on the page
    at the position the step was made after: every layer's top-1 and the chosen token's rank and p, as
    the JSON document has them."""
    from clitools import invoke
    from tiny import save_tiny

    model = save_tiny(tmp_path / "tiny")
    page = tmp_path / "journey.html"
    args = ("trace", "The Eiffel Tower", "--model", model, "--steps", "3", "--lens", "--html", str(page), "--json")
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    doc, lens = json.loads(out), data_of(page.read_text())["lens"]
    first = len(doc["prompt"]) - 1
    assert sorted(int(p) for p in lens) == [first + i for i in range(3)]
    for i, step in enumerate(doc["steps"]):
        rows = lens[str(first + i)]
        assert [r[0] for r in rows] == [layer["layer"] for layer in step["lens"]]
        for row, layer in zip(rows, step["lens"]):
            assert row[1:4] == [layer["top"][0]["id"], layer["top"][0]["text"], layer["top"][0]["prob"]]
            assert row[4:] == [layer["chosen_rank"], layer["chosen_prob"], layer["label"]]
        assert rows[0][6] == "emb" and rows[-1][6] == f"L{rows[-1][0] - 1}"  # (as the app numbers them)
    plain = tmp_path / "plain.html"
    code, _, err = invoke(monkeypatch, capsys, "trace", "The Eiffel Tower", "--model", model, "--steps", "2",
                          "--html", str(plain))  # fmt: skip
    assert code == 0 and data_of(plain.read_text())["lens"] == {}, err


def test_chart_labels_fit_their_room():
    from tokenviz.files.svg_charts import tick

    assert [tick(v) for v in (0, 17, 2265, 12345.0, 0.318, 5.6, 0.00005)] == [
        "0",
        "17",
        "2.27k",
        "12.3k",
        "0.318",
        "5.6",
        "5e-05",
    ]
    assert all(len(tick(v)) <= 6 for v in (0.1234567, 99999.0, 1234.5, 0.00012345))


def test_entropy_and_p_chosen_are_charted_each_on_its_own_axis():
    """Issue 51, item 10: p(chosen) was drawn on the entropy's axis (bits); it has its own, 0 to 1."""
    snapshot, attention, _ = frozen_recording(steps=6)
    html = journey_page(snapshot, attention, COLORS)
    charts = {re.search(r"<title>(.*?)</title>", svg).group(1): svg for svg in re.findall(r"<svg.*?</svg>", html, re.S)}
    p_chart = next(svg for title, svg in charts.items() if title.startswith("p(chosen) by step"))
    entropy_chart = next(svg for title, svg in charts.items() if title.startswith("entropy by step (bits"))
    ticks = re.findall(r'class="tick">([^<]*)<', p_chart)
    assert ticks[:2] == ["0", "1"]  # the y axis: a probability's
    assert "p chosen" in p_chart and "p chosen" not in entropy_chart
    from tokenviz.files.svg_charts import tick

    top = max(r.entropy for r in snapshot.records)  # the entropy's axis: bits, up to the highest
    assert re.findall(r'class="tick">([^<]*)<', entropy_chart)[1] == tick(top)


def test_a_greedy_steps_final_p_is_one_as_in_the_app():
    """Issue 69, finding 20 on the page: "final p" gave greedy's raw p where the app shows its final
    distribution one-hot; the raw p stays beside it."""
    from tokenviz.contract.settings import SamplingSettings

    snapshot, attention, _ = frozen_recording(steps=3, settings=SamplingSettings(temperature=0))
    data = data_of(journey_page(snapshot, attention, COLORS))
    for step, record in zip(data["steps"], snapshot.records, strict=True):
        assert step["mode"] == "greedy" and step["chosen_prob"] == 1.0
        assert step["raw_prob"] == record.decision.raw_prob < 1


def test_every_chart_title_fits_its_chart_local_and_served():
    """Issue 69, finding 14: a chart's title was cut ("…the chosen token's final probabili")."""
    import dataclasses

    from tokenviz.files.svg_charts import TITLE_CHARS
    from tokenviz.ui.colors import page_colors
    from tokenviz.ui.themes import DEFAULT_THEME, load_themes

    snapshot, _, _ = frozen_recording(steps=6)
    served = dataclasses.replace(
        snapshot.info, covers=20, requests="the server at 127.0.0.1:8000", numbers_of="the server"
    )
    colors = page_colors(load_themes()[DEFAULT_THEME])
    for shown in (snapshot, dataclasses.replace(snapshot, info=served)):
        titles = [
            re.search(r'class="chart-title">([^<]*)<', c).group(1) for c in page_module._charts(shown, dict(colors))
        ]
        assert len(titles) >= 3 and all(len(html.unescape(t)) <= TITLE_CHARS for t in titles), titles
