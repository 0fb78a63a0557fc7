"""`tokenviz sae-train`: a TopK SAE trained here on the model's residual, in SAELens's layout: it explains
more of the residuals than it did untrained, `trace --sae` reads it, SAELens itself loads it and encodes as
tokenviz does; its mistakes are one line each."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import sae_reference
import torch
from clitools import invoke
from tiny import save_tiny

from tokenviz.features.sae_folder import read_saes

pytestmark = pytest.mark.features
TEXT = (
    "The Eiffel Tower is located in Paris. It was built in 1889 for the World Fair. The river Seine runs "
    "through the city, and its bridges are famous. Many people visit every year, and some climb the stairs.\n"
) * 8


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-sae-train"), "llama", context=64)


def test_a_trained_sae_explains_more_and_saelens_reads_it_as_tokenviz_does(
    tmp_path, tiny_dir, monkeypatch, capsys, sae_libraries
):
    python = sae_reference.python_of(sae_libraries)
    text, out = tmp_path / "text.txt", tmp_path / "sae"
    text.write_text(TEXT)
    args = ["sae-train", "--model", tiny_dir, "--text", str(text), "--layer", "1", "--out", str(out)]
    code, said, err = invoke(monkeypatch, capsys, *args, "--features", "64", "--k", "8", "--steps", "300")
    assert code == 0, err
    assert said.strip() == f"wrote {out} (an SAE in SAELens' layout: tokenviz trace PROMPT --sae {out})"
    before, after = (float(v) for v in re.search(r"variance ([\d.]+) at the start, ([\d.]+) now", err).groups())
    assert after < 0.8 * before and after < 1, err
    (sae,) = read_saes(out)
    assert (sae.architecture, sae.layer, sae.d_sae, sae.k) == ("topk", 1, 64, 8)
    code, doc, err = invoke(monkeypatch, capsys, "trace", "The river", "--model", tiny_dir, "--steps", "2",
                            "--sae", str(out), "--json")  # fmt: skip
    assert code == 0 and all(step["sae"][0]["l0"] == 8 for step in json.loads(doc)["steps"]), err
    x = torch.randn(5, sae.d_in, generator=torch.Generator().manual_seed(1))
    theirs = sae_reference.encode(python, "sae_lens", out, x.numpy(), tmp_path)
    np.testing.assert_allclose(sae.encode(x).numpy(), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "more, said",
    [
        (["--k", "80", "--features", "64"], "--k 80 is more than --features 64"),
        (["--layer", "9"], "--layer 9: "),
        (["--text", "latin1"], "is not UTF-8"),
        (["--out", "taken"], "holds an SAE already: --force writes over it"),
    ],
)
def test_sae_train_mistakes_are_one_line(tmp_path, tiny_dir, monkeypatch, capsys, more, said):
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "latin1").write_bytes("café".encode("latin-1"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "cfg.json").write_text("{}")
    given = {"--text": str(tmp_path / "text.txt"), "--layer": "1", "--out": str(tmp_path / "sae")}
    for name, value in zip(more[::2], more[1::2]):  # a file's name is one in tmp_path
        given[name] = str(tmp_path / value) if name in ("--text", "--out") else value
    args = ["sae-train", "--model", tiny_dir, *(x for pair in given.items() for x in pair)]
    code, _, err = invoke(monkeypatch, capsys, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


async def test_the_app_loads_a_trained_sae_and_shows_its_features(tmp_path, tiny_dir, monkeypatch, capsys):
    """The issue's done-when: `sae-train` makes an SAE that the app loads (`tokenviz --sae DIR`): its features
    view reads it at the cursor, k features on."""
    from apptools import settle, wait_for

    from tokenviz.backends.transformers.loading import load_model
    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.commands import ReadFeatures
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.features import FeaturesPane
    from tokenviz.worker.engine_thread import EngineWorker

    text, out = tmp_path / "text.txt", tmp_path / "trained"
    text.write_text(TEXT)
    args = ["sae-train", "--model", tiny_dir, "--text", str(text), "--layer", "1", "--out", str(out)]
    code, _, err = invoke(monkeypatch, capsys, *args, "--features", "64", "--k", "8", "--steps", "50")
    assert code == 0, err
    loader = lambda progress: ModelRunner(load_model(tiny_dir, device="cpu", dtype="float32"))  # noqa: E731
    worker = EngineWorker(loader, SamplingSettings(temperature=0), "The river", sae_folders=(str(out),))
    app = TokenvizApp(worker)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("F")
        await wait_for(lambda: (r := app.journey.snapshot.result(ReadFeatures)) is not None and r.readings, pilot)
        (reading,) = app.journey.snapshot.result(ReadFeatures).readings
        assert (reading.sae, reading.layer, reading.l0) == ("trained", 1, 8)
        await wait_for(lambda: "trained L1" in str(app.query_one(FeaturesPane).body.render()), pilot)
