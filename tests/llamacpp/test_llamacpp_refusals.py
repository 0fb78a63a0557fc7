"""A refusal on llama.cpp names the runtime, why, and what gives it: `z` said "SmolLM2-135M-Instruct (bundled,
Q4_1 GGUF) does not give its head ablation here", of a model that ablates heads in transformers."""

from __future__ import annotations

import pytest
from apptools import model_text, settle, wait_for
from llama_reference import THREADS, offloaded, offloaded_args

from tokenviz.contract.engine import Capability, refusal_of, why_not

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]


def llama_cpp_loader():
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings

    opening = Opening("app", offloaded(), frozenset(), None, SamplingSettings(temperature=0))
    return BACKEND.loader(opening)


def test_each_capability_llama_cpp_lacks_is_refused_naming_llama_cpp_and_the_remedy():
    info = llama_cpp_loader()(lambda message, fraction: None).info
    for needed in (Capability.ABLATION, Capability.LEAVE_ONE_OUT, Capability.ATTRIBUTION, Capability.LOGIT_SPLIT):
        assert needed.value not in info.capabilities
        brief, whole = why_not(info, needed), refusal_of(info, needed, "the view")
        assert "llama.cpp" in brief and "--backend transformers runs the same GGUF" in brief, brief
        assert info.name not in brief and whole == f"the view needs the engine's {needed.value}: {brief}"


async def test_z_on_llama_cpp_says_llama_cpp_cannot_and_what_can(tmp_path, monkeypatch):
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.model import ModelPane
    from tokenviz.worker.engine_thread import EngineWorker

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    app = TokenvizApp(EngineWorker(llama_cpp_loader(), SamplingSettings(temperature=0), "The Eiffel Tower is"))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot, timeout=120)
        await pilot.press("z")
        said = lambda: " ".join(n.message for n in app._notifications)  # noqa: E731
        await wait_for(lambda: "cannot reach one head" in said(), pilot)
        assert "llama.cpp computes a layer's heads together" in said() and "M lists" not in said(), said()
        assert "--backend transformers runs the same GGUF" in said()
        await pilot.press("M")
        await wait_for(lambda: app.screen.query(ModelPane), pilot)
        shown = model_text(app.screen.query_one(ModelPane))
        assert "no head ablation" in shown and "no leave-one-out" in shown, shown


def test_the_backend_writes_how_to_open_its_model_again_with_its_attention():
    """A recording's hint to run it live is the backend's own command (ModelInfo.reopen): no module outside
    the backends asks which runtime ran it."""
    import shlex

    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.system.paths import bundled_gguf

    assert llama_cpp_loader()(lambda message, fraction: None).info.reopen == "tokenviz --backend llama.cpp"
    values = {"threads": THREADS, "flash_attention": "off"}
    opening = Opening("app", values, frozenset(values), str(bundled_gguf()), SamplingSettings(temperature=0))
    reopen = BACKEND.loader(opening)(lambda message, fraction: None).info.reopen
    assert shlex.split(reopen) == [
        "tokenviz", "--backend", "llama.cpp", "--model", bundled_gguf().name, "--flash-attention", "off"
    ]  # fmt: skip


def test_gpu_layers_run_on_a_gpu_build_and_are_one_line_on_a_cpu_build(monkeypatch, capsys):
    """--gpu-layers on a llama-cpp-python built for the CPU alone was run on the CPU, unsaid: now one line
    naming the build that offloads, exit 2. Where the build offloads, the model view says where it runs."""
    import json

    import llama_cpp
    from clitools import invoke

    args = ("trace", "x", "--backend", "llama.cpp", "--steps", "1", "--temperature", "0", *offloaded_args())
    code, out, err = invoke(monkeypatch, capsys, *args, "--gpu-layers", "1000", "--json")
    if llama_cpp.llama_supports_gpu_offload():
        assert code == 0, err
        assert json.loads(out)["model"]["device"] == "gpu (llama.cpp: every layer and the head)"
        return
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "--gpu-layers 1,000: this llama-cpp-python was built for the CPU alone" in errors[0]
    assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in errors[0]


def test_the_model_view_says_which_layers_llama_cpp_offloads():
    from tokenviz.backends.llamacpp.runtime import placement_said

    assert placement_said(0, 30) == "cpu (llama.cpp)"
    assert placement_said(12, 30) == "gpu and cpu (llama.cpp: the last 12 of 30 layers on the gpu)"
    assert placement_said(30, 30) == "gpu and cpu (llama.cpp: the last 30 of 30 layers on the gpu)"
    assert placement_said(31, 30) == placement_said(999, 30) == "gpu (llama.cpp: every layer and the head)"


def test_the_test_commands_gpu_layers_reach_both_sides(request, monkeypatch):
    """`pytest --gpu-layers N` (a GPU's run of the llama.cpp tests) offloads N layers in tokenviz's openings
    and command lines and in llama-cpp-python's own Llama alike: the reference runs where tokenviz does."""
    import llama_reference

    assert llama_reference.GPU_LAYERS[0] == request.config.getoption("--gpu-layers")
    monkeypatch.setattr(llama_reference, "GPU_LAYERS", [3])
    assert offloaded() == {"threads": THREADS, "gpu_layers": 3}
    assert offloaded_args() == [f"--threads={THREADS}", "--gpu-layers=3"]
    assert next(llama_reference.own_llama()).model_params.n_gpu_layers == 3
