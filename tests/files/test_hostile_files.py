"""Damaged, hostile and special files, and writes that must not lose what the user has."""

import copy
import json
import os

import pytest
from apptools import frozen_recording, make_app, settle, wait_for
from clitools import invoke
from tiny import save_tiny

from tokenviz.files import atomic, journey_file
from tokenviz.files.journey_file import journey_file as journey_of

VALID = json.loads(json.dumps(journey_of(*frozen_recording(steps=3))))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-hostile"), "llama", context=64)


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize(
    "damage, field",
    [
        (lambda d: d["replay"]["records"][1]["attention"].update(shape=[1, 1, 1, 1]), "replay.records.1.attention"),
        (lambda d: d["replay"]["info"].update(layers=-1), "replay.info.layers"),
        (lambda d: d["replay"]["info"].update(layers="30"), "replay.info.layers"),
        (lambda d: d["replay"].update(prompt_len=10**6), "replay: Value error"),
        (lambda d: d["replay"]["records"][0]["top"][0].__setitem__(3, "0.5"), "replay.records.0.top.0.prob"),
        (lambda d: d.pop("prompt"), "prompt"),
        (lambda d: d["replay"]["records"][0]["decision"].pop("settings"), "replay.records.0.decision.settings"),
        (lambda d: d.update(step_views=[[1]]), "step_views.0"),
    ],
)
@pytest.mark.parametrize("verify", [False, True])
def test_a_damaged_journey_gets_one_line_naming_the_field(
    monkeypatch, capsys, tmp_path, tiny_dir, damage, field, verify
):
    doc = copy.deepcopy(VALID)
    damage(doc)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    extra = ["--verify", "--model", tiny_dir] if verify else []
    code, _, err = invoke(monkeypatch, capsys, "replay", str(path), *extra)
    assert code == 2
    line = one_error(err)
    assert "damaged" in line and field.split(":")[0] in line


@pytest.mark.parametrize(
    "args",
    [["replay", "{d}"], ["trace", "Hi", "--json-schema", "{d}"], ["trace", "Hi", "--grammar", "{d}"],
     ["trace", "Hi", "--device-map", "{d}"]],
    ids=["replay", "json-schema", "grammar", "device-map"],
)  # fmt: skip
def test_a_directory_given_as_a_file_is_one_line(monkeypatch, capsys, tmp_path, args):
    folder = tmp_path / "folder.json"
    folder.mkdir()
    code, _, err = invoke(monkeypatch, capsys, *(a.format(d=folder) for a in args))
    line = one_error(err)  # (it had been an IsADirectoryError traceback)
    assert code == 2 and ("is a directory" in line or "is not a regular file" in line)


def test_special_large_and_future_files_are_refused(monkeypatch, capsys, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path, message in [(fifo, "is not a regular file"), ("/dev/zero", "is not a regular file")]:
        code, _, err = invoke(monkeypatch, capsys, "replay", str(path))
        assert code == 2 and message in one_error(err)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(VALID))
    monkeypatch.setattr(journey_file, "MAX_FILE_BYTES", 1000)
    code, _, err = invoke(monkeypatch, capsys, "replay", str(big))
    assert code == 2 and "journeys of up to 0 MB" in one_error(err)
    monkeypatch.undo()
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**VALID, "format": "tokenviz-journey/3"}))
    code, _, err = invoke(monkeypatch, capsys, "replay", str(future))
    said = "has format tokenviz-journey/3; this tokenviz reads tokenviz-journey/2, tokenviz-journey/1"
    assert code == 2 and said in one_error(err)


def test_save_never_replaces_a_file_unless_forced(monkeypatch, capsys, tmp_path, tiny_dir):
    path = tmp_path / "keep.json"
    path.write_text("mine")
    args = ["trace", "Hello world", "--model", tiny_dir, "--steps", "2", "--save", str(path), "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and "exists already" in one_error(err) and path.read_text() == "mine" and out == ""
    code, out, err = invoke(monkeypatch, capsys, *args, "--force")
    assert code == 0 and json.loads(path.read_text())["format"] == "tokenviz-journey/2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]  # no temporary file left behind


def test_a_failing_write_keeps_the_old_file_and_the_runs_output(monkeypatch, capsys, tmp_path, tiny_dir):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(VALID))

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", disk_full)
    args = ["trace", "Hello world", "--model", tiny_dir, "--steps", "2", "--save", str(path), "--force", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and "No space left on device" in one_error(err)
    assert json.loads(out)["steps"]  # the trace still printed
    assert json.loads(path.read_text()) == VALID  # the old journey is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


async def test_two_quick_exports_write_two_journeys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("x", "x")
        await wait_for(lambda: len(list(tmp_path.glob("tokenviz-*.json"))) == 2, pilot)
        await wait_for(lambda: len(list(tmp_path.glob("tokenviz-*.svg"))) == 2, pilot)
        await wait_for(lambda: len(list(tmp_path.glob("tokenviz-*.html"))) == 2, pilot)
    assert not list(tmp_path.glob(".*.tmp"))


async def test_an_export_into_a_read_only_directory_says_why_and_the_app_goes_on(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.chdir(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.journey.action_export_svg()  # the palette's "Export SVG"
        await wait_for(lambda: any("Read-only file system" in n.message for n in app._notifications), pilot)
        await pilot.press("space")
        await wait_for(lambda: len(app.journey.snapshot.records) == 2, pilot)
    assert list(tmp_path.iterdir()) == []
