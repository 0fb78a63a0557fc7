"""--quantize int8: the weights quantized as they load, by transformers' own TorchAoConfig; the numbers
are the quantized model's own, and the model section says how it was quantized."""

import json

import pytest
import torch
from test_loading import save_random

from tokenviz.backends.transformers.loading import load_model
from tokenviz.contract.placement import Placement

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
INT4_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}  # groups of 128


def transformers_own(directory: str):
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    config = TorchAoConfig(Int8WeightOnlyConfig())
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, quantization_config=config)


def assert_same_logits(ours, theirs):
    with torch.inference_mode():
        torch.testing.assert_close(ours(IDS).logits, theirs(IDS).logits, rtol=0, atol=1e-6)


def test_int8_is_transformers_own_quantized_model(tmp_path):
    directory = save_random(tmp_path, "llama", **SHAPE)
    loaded = load_model(directory, device="cpu", dtype="float32", placement=Placement(quantize="int8"))
    assert loaded.info.quantization.startswith("int8 weights (torchao Int8WeightOnlyConfig)")
    assert "int8" in loaded.info.memory or "needs" in loaded.info.memory
    assert_same_logits(loaded.model, transformers_own(directory))
    whole = load_model(directory, device="cpu", dtype="float32")
    with torch.inference_mode():
        differ = (loaded.model(IDS).logits - whole.model(IDS).logits).abs().max()
    assert 0 < differ < 0.1  # rounding of the weights, not another model


@pytest.mark.bundled
def test_int8_on_the_bundled_model(monkeypatch, capsys):
    from clitools import invoke

    from tokenviz.backends.transformers.gguf_cache import gguf_cache_dir
    from tokenviz.system.paths import bundled_gguf

    args = ["The capital of France is", "--quantize", "int8", "--device", "cpu", "--dtype", "float32"]
    code, out, err = invoke(monkeypatch, capsys, "trace", *args, "--steps", "3", "--temperature", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["quantization"].startswith("int8 weights")
    loaded = load_model(None, device="cpu", dtype="float32", placement=Placement(quantize="int8"))
    assert_same_logits(loaded.model, transformers_own(str(gguf_cache_dir(bundled_gguf()))))


def test_compare_a_model_with_its_int8_self(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    directory = save_random(tmp_path, "llama", **SHAPE)
    code, out, err = invoke(monkeypatch, capsys, "compare", "The cat", "--model", directory, "--device", "cpu",
                            "--dtype", "float32", "--temperature", "0", "--steps", "4",
                            "--against-option", "quantize=int8", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["model"]["quantization"] == "" and doc["b"]["model"]["quantization"].startswith("int8")
    assert all(0 <= d["kl"] < 0.05 for d in doc["diff"]) and doc["diff"][0]["kl"] > 0


def test_the_trace_table_header_says_the_weights_are_int8(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    directory = save_random(tmp_path, "llama", **SHAPE)
    args = ["trace", "The cat", "--model", directory, "--device", "cpu", "--dtype", "float32", "--steps", "2"]
    code, out, err = invoke(monkeypatch, capsys, *args, "--quantize", "int8")
    assert code == 0, err
    assert "· cpu · float32 · int8 weights · 2 layers · 4 heads" in " ".join(out.split())
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0 and "· cpu · float32 · 2 layers" in " ".join(out.split()) and "int8" not in out


def test_int4_without_a_gpu_and_a_bad_choice_are_one_line(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    directory = save_random(tmp_path, "llama", **SHAPE)
    code, _, err = invoke(
        monkeypatch, capsys, "trace", "hi", "--model", directory, "--device", "cpu", "--quantize", "int4"
    )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "int4 needs a CUDA GPU" in errors[0] and "Traceback" not in err
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--quantize", "int3")
    assert code == 2 and "--quantize must be int8 or int4" in err


def test_int4_on_a_gpu_is_transformers_own_quantized_model(tmp_path, device, monkeypatch, capsys):
    """Run with --device cuda (int4's kernel is CUDA's): on the CPU this test has nothing to run."""
    if device != "cuda":
        pytest.skip("int4 needs a CUDA GPU: run the tests with --device cuda")
    from clitools import invoke
    from torchao.quantization import Int4WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    directory = save_random(tmp_path, "llama", **INT4_SHAPE)
    loaded = load_model(directory, device="cuda", dtype="bfloat16", placement=Placement(quantize="int4"))
    assert loaded.info.quantization.startswith("int4 weights (torchao Int4WeightOnlyConfig)")
    config = TorchAoConfig(Int4WeightOnlyConfig(int4_packing_format="tile_packed_to_4d"))
    theirs = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.bfloat16, quantization_config=config, device_map="cuda"
    )
    ids = IDS.to("cuda")
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(ids).logits, theirs(ids).logits, rtol=0, atol=0)
        whole = load_model(directory, device="cuda", dtype="bfloat16")
        differ = (loaded.model(ids).logits.float() - whole.model(ids).logits.float()).abs().max()
    assert 0 < differ < 0.5  # rounding of the weights to 4 bits, not another model
    args = ["hi", "--model", directory, "--device", "cuda", "--quantize", "int4", "--steps", "3", "--json"]
    code, out, err = invoke(monkeypatch, capsys, "trace", *args)
    assert code == 0, err
    assert json.loads(out)["model"]["quantization"].startswith("int4 weights")
    code, _, err = invoke(monkeypatch, capsys, "trace", *args, "--dtype", "float16")
    assert code == 2 and "--quantize int4 computes in bfloat16" in err


def test_without_torchao_it_says_how_to_get_it(tmp_path, monkeypatch):
    from tokenviz.backends.transformers import quantizing
    from tokenviz.contract.errors import ModelLoadError

    directory = save_random(tmp_path, "llama", **SHAPE)
    real = quantizing.importlib.util.find_spec
    monkeypatch.setattr(quantizing.importlib.util, "find_spec", lambda name: None if name == "torchao" else real(name))
    with pytest.raises(ModelLoadError, match="pip install torchao"):
        load_model(directory, device="cpu", placement=Placement(quantize="int8"))


def test_torchao_installed_prints_nothing_of_its_own(tmp_path):
    import subprocess
    import sys

    # (Without --quantize, the bundled model's trace in tests/cli/test_cli.py checks the same.)
    directory = save_random(tmp_path, "llama", **SHAPE)
    command = [
        sys.executable,
        "-m",
        "tokenviz",
        "trace",
        "hi",
        "--model",
        directory,
        "--steps",
        "1",
        "--quantize",
        "int8",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Failed to load" not in done.stderr and "Enum subclass" not in done.stderr, done.stderr
