"""Record and replay: save a journey, open it without a model, re-run it with one."""

import json

import numpy as np
import pytest
from apptools import PROMPT, make_app, recorded_app, settle, text_of, wait_for
from clitools import invoke
from tiny import save_tiny

from tokenviz.backends.transformers.loading import load_model
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.files.journey_file import read_journey, recording_of, save_journey, snapshot_from_journey
from tokenviz.files.journey_schema import covers_from_top_only
from tokenviz.journey.reproduce import verify_journey
from tokenviz.journey.session import Session
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.worker.snapshots import saved_attention_of


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-journey"), "llama", context=64)


def test_trace_save_then_verify(monkeypatch, capsys, tmp_path, tiny_dir):
    path = tmp_path / "journey.json"
    code, out, err = invoke(
        monkeypatch,
        capsys,
        "trace",
        PROMPT,
        "--model",
        tiny_dir,
        "--steps",
        "6",
        "--temperature",
        "0.9",
        "--seed",
        "5",
        "--save",
        str(path),
        "--html",
        str(tmp_path / "journey.html"),
        "--json",
    )
    assert code == 0, err
    assert f"wrote {path} (the journey: tokenviz replay {path})" in err  # it says what it wrote, and where
    assert f"wrote {tmp_path / 'journey.html'} (the page: open it in any browser)" in err
    doc = read_journey(path)
    assert doc["text"] == json.loads(out)["text"]
    assert len(doc["replay"]["records"]) == 6
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--model", tiny_dir)
    assert code == 0, err
    assert out.strip() == "verified: all 6 steps reproduce the recorded tokens"
    # a tampered recording is caught
    decision = doc["replay"]["records"][3]["decision"]
    decision["chosen_id"] = (decision["chosen_id"] + 1) % 300
    path.write_text(json.dumps(doc))
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--model", tiny_dir)
    assert code == 1 and "step 3 differs" in err


def test_a_file_holds_each_step_once_and_replay_json_prints_the_trace(monkeypatch, capsys, tmp_path, tiny_dir):
    path = tmp_path / "journey.json"
    args = ["--model", tiny_dir, "--steps", "5", "--temperature", "0.8", "--seed", "3", "--lens", "--attention", "1"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, "--save", str(path), "--json")
    assert code == 0, err
    printed, saved = json.loads(out), json.loads(path.read_text())
    assert "steps" not in saved and len(saved["replay"]["records"]) == 5  # stopped at the limit: no pending one
    logit = json.dumps(printed["steps"][2]["top"][0]["logit"])  # a number no other step has
    assert path.read_text().count(logit) == 1  # in its record alone
    assert {"lens", "lens_first_top1_layer", "attention"} <= set(saved["step_views"][0])  # what the views added
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--json")
    assert code == 0, err
    assert json.loads(out) == printed  # the trace's own document, its steps made from the records
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--model", tiny_dir)
    assert code == 0 and "all 5 steps" in out, err


def test_replay_json_prints_nothing_of_a_file_raw(monkeypatch, capsys, tmp_path, tiny_dir):
    """A file's own words (its head's text, its step views) reach stdout made safe: no escape sequence."""
    path = tmp_path / "journey.json"
    code, _, err = invoke(
        monkeypatch, capsys, "trace", PROMPT, "--model", tiny_dir, "--steps", "2", "--save", str(path)
    )
    assert code == 0, err
    doc = json.loads(path.read_text())
    doc["text"] = "\x1b]52;c;aGk=\x07 and \x9b31m"
    doc["step_views"] = [{"lens": [{"label": "\x1b[2J"}]}, {"\x1b[31mkey": "\u202e"}]
    path.write_text(json.dumps(doc))
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--json")
    assert code == 0, err
    printed = json.loads(out)
    for text in (printed["text"], json.dumps(printed["steps"], ensure_ascii=False)):
        assert not any(c in text for c in "\x1b\x07\x9b\u202e"), text
    assert "<0x1B>" in printed["steps"][0]["lens"][0]["label"]


def test_a_journey_saved_in_the_first_format_still_reads(monkeypatch, capsys, tmp_path, tiny_dir):
    path, earlier = tmp_path / "journey.json", tmp_path / "earlier.json"
    args = ["--model", tiny_dir, "--steps", "4", "--temperature", "0.9", "--seed", "2", "--lens"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, "--save", str(path), "--json")
    assert code == 0, err
    printed = json.loads(out)
    # the first format: the trace document, its steps whole, beside the records
    first = {**{k: v for k, v in json.loads(path.read_text()).items() if k != "step_views"}, **printed}
    earlier.write_text(json.dumps({**first, "format": "tokenviz-journey/1"}))
    logit = json.dumps(printed["steps"][2]["top"][0]["logit"])
    assert (path.read_text().count(logit), earlier.read_text().count(logit)) == (1, 2)  # each step once, not twice
    code, out, err = invoke(monkeypatch, capsys, "replay", str(earlier), "--json")
    assert code == 0 and json.loads(out) == printed, err
    assert read_journey(earlier)["step_views"][1]["lens"] == printed["steps"][1]["lens"]
    code, out, err = invoke(monkeypatch, capsys, "replay", str(earlier), "--verify", "--model", tiny_dir)
    assert code == 0 and "all 4 steps" in out, err
    assert recording_of(read_journey(earlier)).snapshot == recording_of(read_journey(path)).snapshot


def test_replay_reproduces_settings_changes_and_branches(tmp_path, tiny_dir):
    loaded = load_model(tiny_dir, device="cpu")
    s = Session(ModelRunner(loaded))
    s.start(PROMPT)
    s.step()
    s.set_settings(s.settings.replace(temperature=1.3, top_k=5, seed=9))
    s.step()
    s.take_rank(3)  # a branch
    s.set_settings(s.settings.replace(temperature=0))
    s.step()
    s.step()
    from tokenviz.files.journey_file import save_journey
    from tokenviz.worker.snapshots import snapshot_of

    s.take_rank(2, steps_back=2)  # and another path, kept as a branch
    s.step()
    path = save_journey(tmp_path / "j.json", snapshot_of(s))
    doc = read_journey(path)
    modes = [record["decision"]["mode"] for record in doc["replay"]["records"][:5]]
    assert modes == ["sampled", "sampled", "forced", "forced", "greedy"]
    restored = snapshot_from_journey(doc)
    assert len(restored.branches) == 2 and restored.branches == snapshot_of(s).branches
    checked, mismatch = verify_journey(doc, Session(ModelRunner(loaded)))
    assert (checked, mismatch) == (5, None)


def test_journey_round_trips_every_record(tmp_path, tiny_dir):
    loaded = load_model(tiny_dir, device="cpu")
    s = Session(ModelRunner(loaded))
    s.start(PROMPT)
    for _ in range(3):
        s.step()
    from tokenviz.files.journey_file import save_journey
    from tokenviz.worker.snapshots import snapshot_of

    original, attention = snapshot_of(s), saved_attention_of(s)
    restored, kept, _ = recording_of(read_journey(save_journey(tmp_path / "j.json", original, attention)))
    assert restored.chips == original.chips and restored.prompt_len == original.prompt_len
    assert restored.info == original.info and restored.settings == original.settings
    assert len(restored.records[0].prompt_predictions) == len(original.chips[: original.prompt_len]) - 1
    for a, b in zip(restored.records, original.records):
        assert a == b  # every field but timings, prompt predictions included
    assert kept.rows.keys() == attention.rows.keys()
    for position, row in attention.rows.items():
        assert np.array_equal(kept.rows[position][..., : position + 1], row)  # float16 both


def test_bad_journey_files_give_one_line(monkeypatch, capsys, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    for name, message in [
        ("missing.json", "no such file"),
        ("bad.json", "is not JSON"),
        ("other.json", "is not a tokenviz journey"),
    ]:
        code, _, err = invoke(monkeypatch, capsys, "replay", str(tmp_path / name))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


async def test_x_while_the_lens_computes_saves_the_lens_not_its_note(tmp_path, monkeypatch):
    """Issue 69, finding 15: `x` pressed while the lens was computing saved "computing the lens for this
    position…" in the SVG. The screenshot waits until the view has drawn what it was computing."""
    monkeypatch.chdir(tmp_path)
    app = make_app(step_seconds=2.0)  # (every forward two seconds: the lens's among them)
    said, notify = [], app.notify
    app.notify = lambda message, **options: (said.append(str(message)), notify(message, **options))[1]
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot, timeout=60)
        await pilot.press("l")
        await wait_for(lambda: "computing the lens" in text_of(app.query_one("#lens").body), pilot)
        await pilot.press("x")
        await wait_for(lambda: list(tmp_path.glob("tokenviz-*.svg")), pilot, timeout=60)
        await wait_for(lambda: list(tmp_path.glob("tokenviz-*.html")), pilot, timeout=60)
        await wait_for(lambda: ".json" in " ".join(said), pilot, timeout=60)  # (said with the frame after it)
        toasts = " ".join(said)
    svg = next(tmp_path.glob("tokenviz-*.svg")).read_text()
    assert "computing&#160;the&#160;lens" not in svg and "computing the lens" not in svg
    assert "logit&#160;lens" in svg or "logit lens" in svg
    assert "waits for the view being computed" in toasts and ".svg" in toasts and ".json" in toasts, toasts


async def test_a_held_screenshot_is_taken_as_it_is_once_it_has_waited_its_longest(tmp_path, monkeypatch):
    from tokenviz.ui import screen_export, worker_screen

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(screen_export, "EXPORT_WAIT_S", 0.5)
    monkeypatch.setattr(worker_screen.WorkerScreen, "computing", lambda self: True)  # (a view that never comes)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("x")
        await wait_for(lambda: list(tmp_path.glob("tokenviz-*.svg")), pilot, timeout=30)
        assert any("waits for the view being computed" in str(n.message) for n in app._notifications)


async def test_x_exports_and_replay_opens_it_without_a_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "2", "[", "h", "h", "left")  # another layer, head 1, the cursor moved
        live = await settle(app, pilot)
        where = (app.journey.model_layer, app.journey.head, app.journey.cursor)
        await pilot.press("x")
        await wait_for(lambda: list(tmp_path.glob("tokenviz-*.json")) and list(tmp_path.glob("tokenviz-*.svg")), pilot)
        await wait_for(lambda: list(tmp_path.glob("tokenviz-*.html")), pilot)
    saved = next(tmp_path.glob("tokenviz-*.json"))
    page = next(tmp_path.glob("tokenviz-*.html")).read_text()
    assert page.startswith("<!doctype html>") and saved.stem == next(tmp_path.glob("tokenviz-*.html")).stem
    layer, head, cursor = where
    assert f'"view":{{"layer":{layer},"head":"{head}","cursor":{cursor}}}' in page  # the page opens where the app was
    recording = recording_of(read_journey(saved))
    snapshot = recording.snapshot
    assert snapshot.chips == live.chips and len(snapshot.records) == len(live.records)
    assert sorted(recording.attention.rows) == list(range(snapshot.prompt_len + len(snapshot.records) - 1))

    replay = recorded_app(recording)
    async with replay.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: replay.journey.snapshot is not None, pilot)
        await pilot.pause(0.2)
        assert replay.query_one(TokensPane).selection.snapshot.chips == live.chips
        await pilot.press("left", "left", "right_square_bracket", "h")  # view keys work on the recording
        await pilot.pause(0.1)
        assert replay.journey.cursor == len(live.chips) - 3
        assert "entropy" in replay.query_one(NextTokenPane).border_subtitle
        settings = replay.journey.snapshot.settings
        await pilot.press("t")  # keys that would need the model are off in a recording
        await pilot.pause(0.1)
        assert replay.journey.snapshot.settings == settings and not replay.journey.check_action(
            "adjust", ("temperature", -1)
        )
        await pilot.press("l")
        await pilot.pause(0.1)
        assert replay.query_one("#views").current == "lens"


def test_a_chat_journey_keeps_its_template_marks_and_mode(tmp_path):
    from tiny import tiny_chat_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.journey.session import Session
    from tokenviz.worker.snapshots import snapshot_of

    s = Session(ModelRunner(tiny_chat_model()))
    s.start("Hello there", chat=True, system="Be brief.")
    s.step()
    original = snapshot_of(s)
    restored, _, _ = recording_of(read_journey(save_journey(tmp_path / "chat.json", original, saved_attention_of(s))))
    assert restored.chips == original.chips and any(c.is_template for c in restored.chips)
    assert (restored.chat, restored.system, restored.prompt) == (True, "Be brief.", "Hello there")


async def test_replay_steps_through_the_recording_with_the_step_keys():
    from apptools import frozen_recording

    recording = frozen_recording(steps=4)
    full = recording.snapshot
    replay = recorded_app(recording)
    async with replay.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: replay.journey.snapshot is not None, pilot)
        await pilot.press("backspace", "backspace")
        await wait_for(lambda: replay.journey.snapshot.handled >= replay.journey.worker.submitted, pilot)
        s = replay.journey.snapshot
        assert len(s.chips) == len(full.chips) - 2 and s.chips == full.chips[: len(s.chips)]
        assert s.pending == full.records[len(s.chips) - full.prompt_len]  # the decision recorded there
        assert s.error is None and "step 2 of 4" in s.message
        assert s.attention is not None and s.attention.queries.stop == len(s.chips)  # rows of the shorter path
        await pilot.press("space")
        await wait_for(lambda: replay.journey.snapshot.handled >= replay.journey.worker.submitted, pilot)
        assert len(replay.journey.snapshot.chips) == len(full.chips) - 1
        await pilot.press("r")
        await wait_for(lambda: replay.journey.snapshot.handled >= replay.journey.worker.submitted, pilot)
        assert len(replay.journey.snapshot.chips) == full.prompt_len
        await pilot.press(*["space"] * 6)  # never past the end
        await wait_for(lambda: replay.journey.snapshot.handled >= replay.journey.worker.submitted, pilot)
        s = replay.journey.snapshot
        assert s.chips == full.chips and s.records == full.records and s.stop_reason == full.stop_reason


def test_a_journey_saved_before_covers_reads_its_top_n_as_a_servers(tmp_path, tiny_dir):
    """A file saved before ModelInfo said its numbers as data named a server's top N `top_only`: it
    reads as `covers` N on a remote model, so the panes label it as they did; the runtime is said now."""
    loaded = load_model(tiny_dir, device="cpu")
    s = Session(ModelRunner(loaded))
    s.start(PROMPT)
    s.step()
    from tokenviz.worker.snapshots import snapshot_of

    saved = json.loads(save_journey(tmp_path / "j.json", snapshot_of(s), saved_attention_of(s)).read_text())
    info = saved["replay"]["info"]
    assert info["runtime"].startswith("transformers ") and info["covers"] == 0
    assert info["requests"] == "" and info["draws"] == ""
    for name in ("covers", "requests", "numbers_of", "draws", "runtime"):
        info.pop(name)

    def read_with(top_only: int):
        (old := tmp_path / f"old-{top_only}.json").write_text(
            json.dumps({**saved, "replay": {**saved["replay"], "info": {**info, "top_only": top_only}}})
        )
        return recording_of(read_journey(old))[0].info

    assert read_with(0).covers == 0 and not read_with(0).requests
    with pytest.raises(TokenvizError, match=r"log-probability of .* above 0"):  # (a top N's: checked as a server's)
        read_with(20)
    served = covers_from_top_only({**info, "top_only": 20})
    assert served["covers"] == 20 and served["requests"] == "a server" and "top_only" not in served
    hosted = covers_from_top_only({**info, "covers": 20, "remote": "127.0.0.1:8000"})  # (saved before `requests`)
    assert hosted["requests"] == "the server at 127.0.0.1:8000" and hosted["numbers_of"] == "the server"
    assert "remote" not in hosted and "remote" not in covers_from_top_only({**info, "remote": ""})
