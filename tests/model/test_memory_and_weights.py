"""A model is checked before it loads: that it fits (from its config alone, in seconds and without
the process growing), and that its checkpoint holds the weights its architecture needs."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_loading import save_random

from bench.checkpoints import SHAPES, run_with_peak, sparse_checkpoint
from tokenviz.backends.transformers import memory
from tokenviz.backends.transformers.loading import load_model

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


def test_a_model_too_large_is_refused_in_one_line_before_anything_grows(tmp_path):
    """8B within --max-memory here; 70B (without a limit) is the bench's `refusal`, which
    tests/project/test_bench.py runs and checks."""
    shape, limit = "8B", ["--max-memory", "cpu=4GB"]
    sparse_checkpoint(tmp_path, SHAPES[shape])
    command = [sys.executable, "-m", "tokenviz", "trace", "hi", "--model", str(tmp_path), "--device", "cpu", *limit]
    code, stderr, peak_kib = run_with_peak(command)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "needs" in errors[0] and "of weights in" in errors[0] and "free" in errors[0]
    assert "within --max-memory has 4.0 GB free" in errors[0]  # bfloat16 would not fit either: none offered
    assert peak_kib < 1024 * 1024  # 1 GB: the config was counted, nothing was loaded


def test_the_count_on_the_meta_device_is_the_loaded_models(tmp_path):
    from transformers import AutoConfig

    directory = save_random(tmp_path, "llama", tie_word_embeddings=False, **SMALL)
    loaded = load_model(directory, device="cpu", dtype="float32")
    count = memory.parameter_count(AutoConfig.from_pretrained(directory))
    assert count.total == sum(p.numel() for p in loaded.model.parameters())
    assert "needs" in loaded.info.memory and "free on cpu" in loaded.info.memory


@pytest.mark.parametrize("kind", ["llama", "gpt2", "deepseek_v3"])
def test_the_kv_cache_counted_from_the_config_is_what_the_cache_holds(kind):
    """A token's KV cache as the memory check counts it before loading equals what the model's cache
    holds once it runs: keys and values of every key/value head, or under multi-head latent attention
    (DeepSeek V3) one latent and one rotary key, far smaller."""
    from families import family_config, family_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.journey.session import Session

    config = family_config(kind)
    counted = memory.need(config, memory.parameter_count(config), torch.float32)
    session = Session(ModelRunner(family_model(kind)))
    session.start("The cat sat on the mat.")
    runner = session.engine
    assert counted.kv // counted.tokens == runner.kv_bytes // runner.kv_len
    assert runner.info.latent_kv == (kind == "deepseek_v3") == memory.parameter_count(config).latent_kv


def test_a_config_whose_layers_differ_is_counted_layer_by_layer_and_opens(tmp_path, monkeypatch, capsys):
    """transformers 5.24 refuses to read Gemma 4's head size from the whole config (it varies by layer):
    tokenviz reads each layer's, so the model opens, and its KV cache is counted as it is kept."""
    from clitools import invoke
    from families import gemma4_config, model_of
    from tiny import tiny_tokenizer
    from transformers import AutoModelForCausalLM

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.journey.session import Session

    config = gemma4_config()
    assert config.is_heterogeneous
    counted = memory.need(config, memory.parameter_count(config), torch.float32)
    session = Session(ModelRunner(model_of(config, "tiny-gemma4")))
    session.start("The cat sat on the mat.")
    assert counted.kv // counted.tokens == session.engine.kv_bytes // session.engine.kv_len
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    capsys.readouterr()
    code, out, err = invoke(monkeypatch, capsys, "trace", "The cat sat", "--model", str(tmp_path), "--steps", "2",
                            "--temperature", "0", "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["model"]["head_dim"] == 8  # the first layer's, as its cache keeps it


def test_a_model_that_fits_only_in_bfloat16_loads_in_bfloat16_and_says_so(tmp_path, monkeypatch, capsys):
    from clitools import invoke
    from transformers import AutoConfig

    directory = save_random(tmp_path, "llama", **SMALL)
    config, count = AutoConfig.from_pretrained(directory), None
    count = memory.parameter_count(config)
    small, large = (memory.need(config, count, dtype).total for dtype in (torch.bfloat16, torch.float32))
    common = ["trace", "hi", "--model", directory, "--max-memory", f"cpu={(small + large) // 2}", "--device", "cpu"]
    code, out, err = invoke(monkeypatch, capsys, *common, "--steps", "2", "--json")
    assert code == 0, err
    model = json.loads(out)["model"]
    assert model["dtype"] == "bfloat16" and "bfloat16 because float32 needs" in model["memory"]
    code, _, err = invoke(monkeypatch, capsys, *common, "--dtype", "float32", "--steps", "2")
    assert code == 2 and "try --dtype bfloat16" in err  # asked for by name: refused, with what fits


@pytest.mark.parametrize("entry", ["cpu", "cpu=lots", "gpu=2GB", "=3GB"])
def test_a_bad_max_memory_is_one_line_before_torch(monkeypatch, capsys, entry):
    from clitools import invoke

    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--max-memory", entry)
    assert code == 2 and ("--max-memory" in err or "is not a size" in err) and len(err.strip().splitlines()) == 1


def test_sizes_read_as_people_write_them():
    from tokenviz.contract.placement import max_memory, size_bytes

    assert size_bytes("20GB") == 20 * 10**9 and size_bytes("8GiB") == 8 * 2**30 and size_bytes("512 mb") == 512 * 10**6
    assert size_bytes("1.5GB") == 1_500_000_000 and size_bytes("1000") == 1000
    assert max_memory(["0=20GB", "cpu=8GiB"]) == {"cuda:0": 20 * 10**9, "cpu": 8 * 2**30}


def weights_of(directory):
    return load_file(str(directory / "model.safetensors"))


@pytest.mark.parametrize("change", ["missing", "unexpected", "almost all missing"])
def test_a_checkpoint_without_the_weights_its_config_needs_is_refused(tmp_path, monkeypatch, capsys, change):
    from clitools import invoke

    directory = tmp_path / "model"
    save_random(directory, "llama", **SMALL)
    weights = weights_of(directory)
    if change == "missing":
        del weights["model.layers.1.mlp.up_proj.weight"]
    elif change == "unexpected":
        weights["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    else:
        weights = {"model.norm.weight": weights["model.norm.weight"]}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", str(directory), "--steps", "2")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    expected = {
        "missing": "lacks 1 weight (model.layers.*.mlp.up_proj.weight)",
        "unexpected": "has 1 weight (model.layers.*.mlp.extra.weight) the model does not use",
        "almost all missing": "lacks 20 weights (lm_head.weight, model.embed_tokens.weight, model.layers.*.",
    }[change]
    assert expected in errors[0]


def test_tied_embeddings_are_not_missing(tmp_path):
    directory = save_random(tmp_path, "llama", tie_word_embeddings=True, **SMALL)
    assert "lm_head.weight" not in weights_of(tmp_path)
    loaded = load_model(directory, device="cpu")
    assert loaded.info.tied_embeddings


def test_quantized_weights_are_counted_smaller_and_offered_when_they_fit(tmp_path, monkeypatch, capsys):
    from clitools import invoke
    from transformers import AutoConfig

    wide = {**SMALL, "hidden_size": 128, "intermediate_size": 512, "max_position_embeddings": 64}  # mostly linears
    directory = save_random(tmp_path, "llama", **wide)
    config = AutoConfig.from_pretrained(directory)
    count = memory.parameter_count(config)
    plain, int8 = memory.need(config, count, torch.float32), memory.need(config, count, torch.float32, "int8")
    assert plain.weights - int8.weights == count.in_linears * 3  # four bytes become one
    limit = f"cpu={(int8.total + memory.need(config, count, torch.bfloat16).total) // 2}"
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", directory, "--max-memory", limit,
                          "--device", "cpu", "--dtype", "float32")  # fmt: skip
    assert code == 2 and "try --quantize int8" in err and "--dtype bfloat16" not in err


@pytest.mark.bundled
def test_a_gguf_too_large_to_convert_is_refused_before_converting(tmp_path, monkeypatch, capsys):
    from clitools import invoke

    from tokenviz.backends.transformers import gguf_cache
    from tokenviz.system.paths import bundled_gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no conversion yet
    monkeypatch.setattr(gguf_cache, "free_bytes", lambda device, limits: (100 * 10**6, False))  # 100 MB free
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--device", "cpu")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert "dequantises it to 0.5 GB of float32 weights on disk, holding 0.8 GB in memory" in errors[0]
    assert "0.1 GB of memory free" in errors[0]
    directory = gguf_cache.gguf_cache_dir(bundled_gguf())
    assert not directory.exists() and not directory.with_name(directory.name + ".partial").exists()
