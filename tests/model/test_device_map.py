"""A model spread by a device map over the CPU and the disk (`--device-map auto --max-memory
cpu=SIZE` below its size) gives the numbers the model gives whole: steps, the lens, attention rows,
verify and the command line's trace."""

import json

import pytest
import torch
from apptools import model_text
from test_loading import save_random

from tokenviz.backends.transformers.lens import inspect_positions
from tokenviz.backends.transformers.loading import load_model
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.placement import Placement
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.record_json import record_json
from tokenviz.journey.session import Session
from tokenviz.journey.verification import verify_latest

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
CPU_SHARE = "cpu=500000"  # of about 0.8 MB of weights: the embedding and one layer; the rest on the disk
# With --device cuda: the GPU takes the embedding, the CPU two layers, the disk the rest.
SHARES = {"cpu": (CPU_SHARE,), "cuda": ("0=300000", CPU_SHARE)}
PLACES = {"cpu": {"cpu", "disk"}, "cuda": {0, "cpu", "disk"}}
PROMPT = "The cat sat on the mat. The dog"
STEPS = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory, device):
    directory = tmp_path_factory.mktemp("model")
    save_random(directory, "llama", **SHAPE)
    whole = load_model(str(directory), device=device, dtype="float32")
    offload = str(tmp_path_factory.mktemp("offload"))
    spread = load_model(
        str(directory), device=device, dtype="float32", placement=Placement("auto", SHARES[device], offload)
    )
    return str(directory), whole, spread


def journey(loaded) -> Session:
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=100))
    session.start(session.engine.encode(PROMPT))
    for _ in range(STEPS):
        session.step()
    return session


def test_the_layers_that_do_not_fit_live_on_the_disk(models, device):
    _, _, spread = models
    placed = set(spread.model.hf_device_map.values())
    assert placed == PLACES[device], spread.model.hf_device_map
    if device == "cpu":
        assert "cpu: layer 0" in spread.info.placement and "disk: layers 1-3" in spread.info.placement
    else:
        assert spread.info.placement.startswith("cuda:0: 1 other part") and "cpu: layers 0-1" in spread.info.placement


def test_a_device_map_from_a_file_puts_each_part_where_it_says(models, tmp_path):
    directory, whole, _ = models
    parts = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    parts |= {f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(4)}
    (tmp_path / "map.json").write_text(json.dumps(parts))
    placement = Placement(str(tmp_path / "map.json"), (), str(tmp_path / "offload"))
    mapped = load_model(directory, device="cpu", dtype="float32", placement=placement)
    assert mapped.model.hf_device_map == parts
    assert (
        mapped.info.placement.startswith("cpu: layers 0, 2, 2 other parts")
        and "disk: layers 1, 3, 1 other part" in mapped.info.placement
    )
    assert journey(mapped).ids == journey(whole).ids


def test_steps_lens_attention_rows_and_verify_equal_the_whole_models(models):
    _, whole, spread = models
    a, b = journey(whole), journey(spread)
    assert a.ids == b.ids
    for x, y in zip(a.records, b.records):
        assert [t.id for t in x.top] == [t.id for t in y.top]
        torch.testing.assert_close([t.prob for t in x.top], [t.prob for t in y.top], rtol=0, atol=1e-5)
    n = len(a.ids) - 1  # (the last id is pending: the cache holds the ones before)
    layers = range(whole.info.layers)
    rows_a = a.engine.attention(a.ids[:n], range(n - 4, n), layers)
    rows_b = b.engine.attention(b.ids[:n], range(n - 4, n), layers)
    torch.testing.assert_close(rows_b, rows_a, rtol=0, atol=1e-5)
    _, eager = a.engine.recompute(a.ids[:n])  # eager, without the cache
    torch.testing.assert_close(rows_b[:, :, -1], eager, rtol=0, atol=1e-5)
    lens = inspect_positions(b.engine, b.ids[:n], [n - 1], [b.ids[n]])[0]
    own = inspect_positions(a.engine, a.ids[:n], [n - 1], [a.ids[n]])[0]
    assert lens.lens[-1].top[0][0] == b.ids[n]  # the last layer's lens is the model's own output
    for x, y in zip(lens.lens, own.lens):
        assert abs(x.chosen_prob - y.chosen_prob) < 1e-5 and x.chosen_rank == y.chosen_rank
    assert lens.embedding_head == pytest.approx(own.embedding_head, abs=1e-6)  # read from the disk
    check = verify_latest(b.engine, b.ids[:n])
    assert check.argmax_agrees and check.max_logit_diff < 1e-4 and check.max_attention_diff < 1e-5


def test_the_trace_with_a_device_map_is_the_trace_without(models, tmp_path, monkeypatch, capsys):
    from clitools import invoke

    directory, _, _ = models
    common = ["trace", PROMPT, "--model", directory, "--device", "cpu", "--steps", "6", "--temperature", "0", "--json"]
    code, whole, err = invoke(monkeypatch, capsys, *common)
    assert code == 0, err
    spread = ["--device-map", "auto", "--max-memory", CPU_SHARE, "--offload-dir", str(tmp_path)]
    code, out, err = invoke(monkeypatch, capsys, *common, *spread)
    assert code == 0, err
    a, b = json.loads(whole), json.loads(out)
    assert a["text"] == b["text"] and "disk: layers 1-3" in b["model"]["placement"]
    assert b["model"]["memory"].startswith("weights placed by the device map")


@pytest.mark.parametrize(
    "value, said",
    [("everywhere", "--device-map must be"), ("{missing}", "cannot read"), ("{bad}", "must map module names")],
)
def test_a_bad_device_map_is_one_line(tmp_path, monkeypatch, capsys, value, said):
    from clitools import invoke

    (tmp_path / "bad.json").write_text(json.dumps({"model.layers.0": "moon"}))
    value = value.replace("{missing}", str(tmp_path / "none.json")).replace("{bad}", str(tmp_path / "bad.json"))
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--device-map", value)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1


async def test_the_model_view_says_where_the_layers_live(models):
    from apptools import settle, wait_for

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    _, _, spread = models
    app = TokenvizApp(EngineWorker(lambda progress: ModelRunner(spread), SamplingSettings(), PROMPT))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("M")
        await wait_for(lambda: app.query_one("#views").current == "model", pilot)
        shown = model_text(app.query_one("#model"))
        assert "placement" in shown and "disk: layers" in shown and "weights placed by the device map" in shown


def test_each_step_is_timed_in_each_place_the_weights_live(models, device, tmp_path):
    from tokenviz.files.journey_file import read_journey, save_journey, snapshot_from_journey
    from tokenviz.worker.snapshots import snapshot_of

    _, whole, spread = models
    places = {"cpu": ["cpu", "disk"], "cuda": ["cuda:0", "cpu", "disk"]}[device]
    session = journey(spread)
    for record in session.records:  # the prefill (its chunks summed) and every step
        assert sorted(place for place, _ in record.place_ms) == sorted(places)  # (in the order the pass met them)
        assert all(ms > 0 for _, ms in record.place_ms)
        assert sum(ms for _, ms in record.place_ms) <= record.forward_ms * 1.01 + 0.05  # within the pass
    assert record_json(record)["ms"]["by_place"] == dict(record.place_ms)
    assert all(not r.place_ms for r in journey(whole).records)  # one place: no hooks, no figures
    path = save_journey(tmp_path / "spread.json", snapshot_of(session))
    replayed = snapshot_from_journey(read_journey(path))
    assert [r.place_ms for r in replayed.records] == [r.place_ms for r in session.records]


async def test_the_timing_view_shows_the_time_in_each_place(models, device):
    from apptools import settle, wait_for

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    _, _, spread = models
    app = TokenvizApp(EngineWorker(lambda progress: ModelRunner(spread), SamplingSettings(temperature=0), PROMPT))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        for _ in range(3):
            await pilot.press("space")
        await wait_for(lambda: app.screen.snapshot is not None and len(app.screen.snapshot.records) >= 4, pilot)
        await pilot.press("i")
        await wait_for(lambda: app.query_one("#views").current == "timing", pilot)
        shown = str(app.query_one("#timing").body.render())
        line = next(line for line in shown.splitlines() if line.startswith("by where the weights live"))
        places = {"cpu": ["cpu", "disk"], "cuda": ["cuda:0", "cpu", "disk"]}[device]
        assert sorted(part.split()[0] for part in line.split(": ", 1)[1].split(" · ")) == sorted(places)


def test_every_view_on_a_spread_model_is_the_whole_models(models):
    from tokenviz.backends.transformers.attribution import attribute
    from tokenviz.backends.transformers.beams import beam_search
    from tokenviz.backends.transformers.logit_difference import logit_difference
    from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode

    _, whole, spread = models
    a, b = journey(whole), journey(spread)
    n = len(a.ids) - 1
    ids, target, other = a.ids[:n], a.ids[n], a.records[-2].top[1].id
    for method in ("loo", "grad"):
        total_a, parts_a = attribute(a.engine, ids, target, method)
        total_b, parts_b = attribute(b.engine, ids, target, method)
        assert total_b == pytest.approx(total_a, abs=1e-5) and parts_b == pytest.approx(parts_a, abs=1e-5)
    split_a, split_b = logit_difference(a.engine, ids, target, other), logit_difference(b.engine, ids, target, other)
    assert split_b.total == pytest.approx(split_a.total, abs=1e-5)
    assert split_b.attention == pytest.approx(split_a.attention, abs=1e-5) and split_b.mlp == pytest.approx(
        split_a.mlp, abs=1e-5
    )
    beams_a, beams_b = (beam_search(s.engine, s.ids, 3, 4, from_cache=True) for s in (a, b))
    assert beams_b.final == beams_a.final and len(beams_b.steps) == len(beams_a.steps) == 4
    greedy = SamplingSettings(temperature=0)
    for spec in ("prompt-lookup", "early-exit:2"):
        runs = [
            speculative_decode(s.engine, s.ids, make_drafter(spec, s.engine), 5, greedy, from_cache=True)
            for s in (a, b)
        ]
        assert list(runs[1].ids) == list(runs[0].ids)


def test_a_model_placed_wholly_on_the_disk_says_so(tmp_path, monkeypatch, capsys):
    """accelerate puts a whole model on the disk when no device may hold any of it ({'': 'disk'}): the
    placement line says so (it was empty for a single place, while every layer was read from the disk)."""
    from clitools import invoke
    from tiny import save_tiny

    directory = save_tiny(tmp_path / "tiny", "llama", context=64)
    code, out, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", directory, "--steps", "2", "--json",
                            "--device-map", "auto", "--max-memory", "cpu=1KB")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["model"]["placement"].startswith("disk: the whole model (")
    code, out, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", directory, "--steps", "2", "--json")
    assert code == 0 and json.loads(out)["model"]["placement"] == ""  # (no device map: nothing to say)
