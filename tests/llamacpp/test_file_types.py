"""A GGUF's quantization named as people name it: a Q4_K_M file was shown as "Medium" (the last word of
llama.cpp's description "Q4_K - Medium") in the status line, `M`, trace's JSON and the page; its tensors'
own types, which a K-quant file mixes (Q5_0 and Q8_0 on rows too narrow for K blocks), said beside it."""

from __future__ import annotations

import json

import pytest
from clitools import invoke
from llama_reference import requantized

from tokenviz.files.gguf_header import read_gguf_header
from tokenviz.system.paths import bundled_gguf

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]


@pytest.mark.parametrize("ftype, mixed", [("Q4_K_M", ("Q4_K", "Q5_0", "F32")), ("Q8_0", ("Q8_0", "F32"))])
def test_a_ggufs_type_is_its_file_type_and_its_tensors_types_are_said(tmp_path, monkeypatch, capsys, ftype, mixed):
    path = requantized(bundled_gguf(), tmp_path / f"smollm2-{ftype}.gguf", ftype)
    assert read_gguf_header(path).file_type() == ftype
    args = ["trace", "The Eiffel Tower is", "--backend", "llama.cpp", "--model", str(path), "--steps", "1", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    model = json.loads(out)["model"]
    assert model["dtype"] == ftype, model  # (was "Medium")
    assert model["quantization"].startswith(f"{ftype} (GGUF, as llama.cpp runs it; tensors: "), model
    assert all(f" {kind}" in model["quantization"] for kind in mixed), model["quantization"]
