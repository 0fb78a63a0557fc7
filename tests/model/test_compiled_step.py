"""--compile: the decode step through torch.compile over a static cache (CUDA graphs on a GPU). Its
numbers are the model's own: every step equals the eager step within float32 rounding, across the
buffers' growth, rewinds, journeys that share the step, hooks in force and a pass that fails."""

import dataclasses
import json

import pytest
import torch
from apptools import model_text
from families import family_model
from test_interventions import same_top
from test_loading import save_random
from tiny import tiny_model
from torch._dynamo.utils import counters

from tokenviz.backends.transformers.compiled_step import CompiledStep, compiled, room_for
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import ModelLoadError, TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

pytestmark = pytest.mark.compile
PROMPT = "The Eiffel Tower is located in"
LEAST = 16  # the buffers' first room: a journey of 60 steps outgrows it twice
SAMPLED = SamplingSettings(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.3, seed=7, max_new_tokens=500)


class Counted:
    """The compiled call, counting how often it ran."""

    def __init__(self, call):
        self.call, self.calls = call, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.call(*args, **kwargs)


@pytest.fixture(scope="module")
def models(device):
    """(eager, compiled): one tiny model, its step compiled once for the module."""
    loaded = tiny_model("llama", context=512, device=device)
    fast = compiled(loaded, lambda message, fraction: None, least=LEAST)
    fast.compiled.call = Counted(fast.compiled.call)
    return loaded, fast


def journeys(models, settings=SAMPLED):
    eager, fast = models
    pair = Session(ModelRunner(eager), settings), Session(ModelRunner(fast), settings)
    for s in pair:
        s.start(PROMPT)
    return pair


def step_both(pair, steps: int) -> None:
    for _ in range(steps):
        for s in pair:
            s.step()
    assert pair[0].ids == pair[1].ids
    for a, b in zip(pair[0].records, pair[1].records, strict=True):
        same_top(a.top, b.top)
        assert a.decision.chosen_id == b.decision.chosen_id


def test_sampled_steps_equal_the_eager_steps_as_the_buffers_grow_and_after_a_rewind(models):
    eager, fast = journeys(models)
    counted = fast.engine.compiled.call
    before, graphs = counted.calls, counters["stats"]["unique_graphs"]
    step_both((eager, fast), 60)
    assert counted.calls - before == 60  # every step ran compiled
    assert counters["stats"]["unique_graphs"] == graphs  # the room doubled twice: nothing compiled again
    assert fast.engine.compiled.capacity == room_for(fast.engine.kv_len, LEAST) > 4 * LEAST
    keys = fast.engine.cache.layers[0].keys
    assert keys.data_ptr() == fast.engine.compiled.static.layers[0].keys.data_ptr()  # a view: nothing copied
    for s in (eager, fast):
        s.rewind(7)
    step_both((eager, fast), 12)
    for s in (eager, fast):
        s.reset()
    step_both((eager, fast), 3)


def test_the_model_info_and_a_saved_journey_say_how_the_steps_ran(models, tmp_path):
    from tokenviz.files.journey_file import read_journey, recording_of, save_journey
    from tokenviz.worker.snapshots import snapshot_of

    eager, fast = journeys(models)
    step_both((eager, fast), 3)
    assert eager.engine.info.compiled == ""
    assert fast.engine.info.compiled == (
        "the decode step, compiled (inductor's code, no graphs off a GPU), over a static cache of 16, 32, 64 …"
        " positions, as the journey needs"
    ) or fast.engine.info.compiled.startswith("the decode step, compiled (CUDA graphs)")
    restored = recording_of(read_journey(save_journey(tmp_path / "j.json", snapshot_of(fast))))[0]
    assert restored.info.compiled == fast.engine.info.compiled


async def test_the_app_steps_compiled_and_its_model_view_says_so(models):
    from apptools import settle, wait_for

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    _, fast = models
    counted = fast.compiled.call
    app = TokenvizApp(EngineWorker(lambda progress: ModelRunner(fast), SamplingSettings(temperature=0), PROMPT))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        before = counted.calls
        await pilot.press("a")  # autoplay, in the engine's own thread
        await wait_for(lambda: len(app.journey.snapshot.records) > 12, pilot, timeout=30)
        await pilot.press("a")
        await settle(app, pilot)
        assert fast.compiled.failed is None  # (on a GPU: the engine thread records the graphs of new rooms)
        assert counted.calls - before == len(app.journey.snapshot.records) - 1  # every step after the prefill
        await pilot.press("M")
        await wait_for(lambda: app.query_one("#views").current == "model", pilot)
        shown = model_text(app.query_one("#model"))
        assert "steps run" in shown and "the decode step, compiled" in shown


def test_greedy_steps_equal_generate(models):
    _, fast = journeys(models, SamplingSettings(temperature=0))
    for _ in range(20):
        fast.step()
    model = models[0].model
    ids = torch.tensor([fast.prompt_ids], device=model.device)
    out = model.generate(ids, do_sample=False, max_new_tokens=20, min_new_tokens=20)
    assert fast.generated_ids == out[0, len(fast.prompt_ids) :].tolist()


def test_compiled_steps_keep_their_query_states_for_the_attention_view(models):
    """The queries come out of the graph: the rows are computed from them, nothing is fed again."""
    eager, fast = journeys(models)
    step_both((eager, fast), 10)
    rows = range(fast.engine.kv_len - 6, fast.engine.kv_len)
    layers = range(fast.engine.info.layers)
    assert fast.engine.rows.queries.missing(rows) == []
    for layer in layers:
        torch.testing.assert_close(
            fast.engine.rows.queries.get(layer, rows), eager.engine.rows.queries.get(layer, rows)
        )
    model = fast.engine.model
    fed = []
    handle = model.register_forward_pre_hook(lambda module, args: fed.append(module))
    try:
        ours = fast.engine.attention(fast.ids, rows, layers)
    finally:
        handle.remove()
    assert fed == []
    torch.testing.assert_close(ours, eager.engine.attention(eager.ids, rows, layers))
    step_both((eager, fast), 4)  # and the journey goes on as it was


def test_two_journeys_share_the_compiled_step(models):
    """As a comparison's two runners do: the buffers follow one cache at a time, the other keeps its own."""
    a_eager, a_fast = journeys(models)
    b_eager, b_fast = journeys(models, SAMPLED.replace(seed=8, temperature=1.2))
    for _ in range(6):
        step_both((a_eager, a_fast), 3)
        step_both((b_eager, b_fast), 3)


def test_a_hook_in_force_runs_the_step_eager(models):
    eager, fast = journeys(models)
    counted = fast.engine.compiled.call
    layer = models[0].model.model.layers[1]  # (both journeys' model)
    handle = layer.register_forward_hook(
        lambda module, args, out: (out[0] * 1.5, *out[1:]) if isinstance(out, tuple) else out * 1.5
    )
    try:
        before = counted.calls
        step_both((eager, fast), 5)
        assert counted.calls == before
    finally:
        handle.remove()
    step_both((eager, fast), 5)
    assert counted.calls == before + 5


def test_a_step_that_fails_says_so_and_the_journey_goes_on_eager(models):
    eager, fast = journeys(models)
    step_both((eager, fast), 3)
    step = fast.engine.compiled
    working = step.call

    def fails_after_running(*args, **kwargs):
        working(*args, **kwargs)  # the buffers written, their counters moved
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    step.call = fails_after_running
    try:
        with pytest.raises(
            TokenvizError, match=r"^the compiled step failed \(CUDA out of memory.\): the steps run eager"
        ):
            fast.step()
        assert fast.ids == eager.ids and len(fast.records) == len(eager.records)  # as it was
        step_both((eager, fast), 4)  # eager now: the failing call is not asked again
    finally:
        step.call, step.failed = working, None


@pytest.mark.parametrize("kind", ["gemma2", "gpt2"])
def test_other_families_step_compiled_as_eager(kind):
    """Gemma 2: sliding-window layers beside global ones, the window shorter than the journey, and
    soft-capped scores (the model's eager attention inside the graph); GPT-2: learned positions."""
    loaded = family_model(kind)
    step = CompiledStep(loaded.model, least=8)
    step.warm_up(torch.device("cpu"))
    step.call = Counted(step.call)
    eager, fast = journeys((loaded, dataclasses.replace(loaded, compiled=step)), SamplingSettings(temperature=0))
    step_both((eager, fast), 30)
    assert step.call.calls == 30
    rows, layers = range(fast.engine.kv_len - 8, fast.engine.kv_len), range(fast.engine.info.layers)
    assert fast.engine.rows.queries.missing(rows) == []  # kept from the graph
    torch.testing.assert_close(
        fast.engine.attention(fast.ids, rows, layers), eager.engine.attention(eager.ids, rows, layers)
    )


def test_trace_compile_says_so_and_gives_the_eager_text(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    from tokenviz.contract.text import safe_text

    directory = save_random(tmp_path, "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    args = ["trace", PROMPT, "--model", directory, "--device", "cpu", "--steps", "6"]
    code, out, err = invoke(monkeypatch, capsys, *args, "--compile")
    assert code == 0, err
    shown = " ".join(out.split())  # (the table wraps at the terminal's width)
    assert "compiling the decode step" in err and "· steps compiled prompt:" in shown
    assert "Escape" not in err  # (the app's key; no key cancels a command but Ctrl+C)
    code, eager, _ = invoke(monkeypatch, capsys, *args, "--json")
    assert code == 0 and json.loads(eager)["model"]["compiled"] == ""
    text = safe_text(json.loads(eager)["full_text"])  # (random weights: any token, control characters too)
    assert "text: " + " ".join(text.split()) + " stopped:" in shown


def test_compile_with_a_device_map_and_a_failed_compile_are_one_line(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--compile", "--device-map", "auto")
    assert code == 2 and "--compile runs a model on one device" in err and len(err.strip().splitlines()) == 1

    def cannot(self, device):
        raise torch._dynamo.exc.Unsupported("generic_jump TensorVariable()\nfrom user code: ...")

    # GPT-Neo's local attention slices its own mask by the cache's length: transformers says it does not compile.
    with pytest.raises(ModelLoadError, match=r"^--compile: transformers does not compile GPTNeoForCausalLM's step"):
        compiled(family_model("gpt_neo"), lambda message, fraction: None)
    monkeypatch.setattr(CompiledStep, "warm_up", cannot)
    with pytest.raises(
        ModelLoadError,
        match=r"^--compile: torch.compile cannot compile .*\(generic_jump TensorVariable\(\)\): run without it$",
    ):
        compiled(tiny_model("llama"), lambda message, fraction: None)


def test_a_compiled_step_never_waits_for_the_gpu(models, device):
    """On a GPU, the compiled step queues its work and returns: no value is read, nothing synchronises
    (the step's one transfer comes after it, in the session). Only a GPU can tell."""
    if device != "cuda":
        pytest.skip("synchronisation is a GPU's: run with --device cuda")
    _, fast = journeys(models)
    fast.step()  # (the buffers made for this journey)
    runner = fast.engine
    torch.cuda.set_sync_debug_mode("error")
    try:
        for token in (5, 6, 7):
            runner.forward([token])
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_thread_that_did_not_import_cuda_graph_trees_gets_their_state_and_others_keep_theirs():
    """The app warms the step up in one thread and may record a new room's graphs in another (torch
    2.11 failed there: cuda-tests-2026-11-26.txt); a thread that has the state keeps it."""
    import threading

    from torch._inductor import cudagraph_trees as trees

    from tokenviz.backends.transformers.compiled_step import graph_trees_in_this_thread

    here = trees.get_obj(trees.local, "tree_manager_containers")
    graph_trees_in_this_thread()
    assert trees.get_obj(trees.local, "tree_manager_containers") is here
    seen = []

    def other() -> None:
        graph_trees_in_this_thread()
        seen.append((trees.get_container(0).device_index, trees.local.tree_manager_containers is here))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [(0, False)]


def test_a_compile_interrupted_part_way_leaves_the_model_eager_and_saying_so():
    """Escape during the warm-up (see tokenviz.system.interruptible): the compile stops in its
    tracing or code generation, and the model's steps run eager, as the model info says."""
    import threading
    import time

    from tokenviz.backends.transformers.compiled_step import COMPILE_CANCELLED
    from tokenviz.system.interruptible import inside, interrupt

    loaded, outcome = tiny_model("llama", context=512), {}
    # The caches of graphs compiled before (this process's, or the disk's) could end the compile before the
    # loop below sees it inside: without them the code is generated again, seconds.
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # (nor this process's compiled code: in a full run a test before compiled the same)
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        thread = threading.Thread(target=lambda: outcome.update(fast=compiled(loaded, lambda m, f: None)), daemon=True)
        thread.start()
        ends = time.monotonic() + 60
        while not inside(thread):
            assert thread.is_alive() and time.monotonic() < ends
            time.sleep(0.001)
        assert interrupt(thread)
        thread.join(120)
    fast = outcome["fast"]
    assert fast.compiled is None and fast.info.compiled == COMPILE_CANCELLED
    eager, again = (Session(ModelRunner(m), SamplingSettings(temperature=0)) for m in (loaded, fast))
    for s in (eager, again):
        s.start(PROMPT)
        for _ in range(5):
            s.step()
    assert again.ids == eager.ids


async def test_escape_while_the_app_compiles_is_acknowledged_and_the_journey_starts_eager(monkeypatch):
    import time

    from apptools import settle, wait_for

    from tokenviz.backends.transformers.compiled_step import COMPILE_CANCELLED
    from tokenviz.system.interruptible import inside
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.status import StatusLine
    from tokenviz.worker.engine_thread import EngineWorker

    warm_up = CompiledStep.warm_up

    def slow_warm_up(step, device):  # (a compile of the tiny model that inductor has seen in this process
        ends = time.monotonic() + 60  # can end before the key lands: this one lasts until Escape stops it)
        while time.monotonic() < ends:
            time.sleep(0.01)
        warm_up(step, device)

    monkeypatch.setattr(CompiledStep, "warm_up", slow_warm_up)
    worker = EngineWorker(
        lambda progress: ModelRunner(compiled(tiny_model("llama", context=512), progress)),
        SamplingSettings(temperature=0),
        PROMPT,
    )
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(lambda: inside(worker._thread), pilot, timeout=60)
        line = app.query_one(StatusLine)  # (the frame that says so can land a moment after the compile starts)
        await wait_for(lambda: "Escape cancels" in str(line.render()), pilot, timeout=60)
        said, update = [], line.update
        line.update = lambda content="", **kw: (said.append(str(content)), update(content, **kw))[1]
        await pilot.press("escape")
        assert any("cancelling" in text for text in said)  # said at once, before the compile stops
        await wait_for(lambda: app.journey.snapshot.state == "ready", pilot, timeout=120)
        await settle(app, pilot)
        s = app.journey.snapshot
        assert s.info.compiled == COMPILE_CANCELLED and s.records and s.error is None  # (the prompt still ran)
        await pilot.press("M")
        await wait_for(lambda: app.query_one("#views").current == "model", pilot)
        assert "the compile was cancelled" in str(app.query_one("#model").body.render())
