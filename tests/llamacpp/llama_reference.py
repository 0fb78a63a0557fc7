"""What the llama.cpp tests hold tokenviz to: llama-cpp-python's own public API on the bundled GGUF, run
outside tokenviz with the same prompt and threads."""

from __future__ import annotations

import ctypes
import json
import os
import re
from collections.abc import Iterator
from importlib.metadata import requires
from pathlib import Path
from typing import Any

import numpy as np

from tokenviz.backends.llamacpp.runtime import default_threads

PROMPT = "The Eiffel Tower is located in"
# Both sides compute with the same threads (llama.cpp splits its sums by thread): tokenviz's default, one
# a worker under the test command's workers (conftest's OMP_NUM_THREADS), where more would spin-wait.
THREADS = default_threads()
GPU_LAYERS = [0]  # the layers both sides offload (the test command's --gpu-layers: tests/llamacpp/conftest.py)


def offloaded() -> dict[str, int]:
    """The options of tokenviz's llama.cpp backend both sides run with: its threads and offloaded layers."""
    return {"threads": THREADS, **({"gpu_layers": GPU_LAYERS[0]} if GPU_LAYERS[0] else {})}


def offloaded_args() -> list[str]:
    """offloaded() as the command line gives it."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in offloaded().items()]


def pin() -> str:
    """The llama-cpp-python requirement of tokenviz's `llamacpp` extra (pyproject.toml: one place)."""
    for requirement in requires("tokenviz") or ():
        if requirement.startswith("llama-cpp-python") and re.search(r"extra == [\"']llamacpp[\"']", requirement):
            return re.split(r"\s*;", requirement)[0]
    raise AssertionError("tokenviz declares no llamacpp extra")


def own_llama(flash_attn: bool = True, path: Path | None = None) -> Iterator[Any]:
    """llama-cpp-python's own Llama on the GGUF at `path` (the bundled one by default), with the model
    parameters tokenviz gives it, as the bench runs it (bench.llamacpp.own_llama), every position's logits
    kept."""
    from bench.llamacpp import own_llama as bench_llama

    yield bench_llama(path, flash_attn=flash_attn, logits_all=True, gpu_layers=GPU_LAYERS[0])


def greedy_session(steps: int, model: str | None = None) -> Any:
    """A greedy journey of `steps` tokens on the GGUF `model` names (None: the bundled one) in tokenviz's
    llama.cpp backend."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    greedy = SamplingSettings(temperature=0)
    opening = Opening("trace", offloaded(), frozenset(), model, greedy)
    session = Session(BACKEND.loader(opening)(lambda message, fraction: None), greedy)
    session.start(PROMPT)
    for _ in range(steps):
        session.step()
    return session


def same_logits_as(reference: Any, doc: dict) -> None:
    """Each step's top logits of a trace's `doc` bit for bit those of `reference` (llama-cpp-python's own
    Llama) fed the journey's passes: the prompt at once, then a token at a time."""
    prompt = [t["id"] for t in doc["prompt"]]
    reference.reset()
    reference.eval(prompt)
    for i, step in enumerate(doc["steps"]):
        logits = np.asarray(reference.scores[len(prompt) - 1 + i], dtype=np.float32)
        ids = [entry["id"] for entry in step["top"][:20]]
        assert [entry["logit"] for entry in step["top"][:20]] == logits[ids].tolist(), i  # bit for bit
        reference.eval([step["chosen"]["id"]])


def trace(monkeypatch, capsys, *more: str, model: Path | None = None) -> dict:
    """`tokenviz trace PROMPT --backend llama.cpp --json *more` on the GGUF `model` (None: the bundled one),
    with the reference's threads and offloaded layers: its document."""
    from clitools import invoke

    chosen = () if model is None else ("--model", str(model))
    args = ["trace", PROMPT, "--backend", "llama.cpp", *chosen, *offloaded_args(), "--json", *more]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    return json.loads(out)


def head_rows(ids: list[int], path: Path | None = None) -> np.ndarray:
    """Rows of the GGUF's output head at `path` (the bundled one by default): its own, else the token
    embeddings (tied), dequantized by gguf itself."""
    from gguf import GGUFReader, dequantize

    from tokenviz.system.paths import bundled_gguf

    tensors = {t.name: t for t in GGUFReader(path or bundled_gguf()).tensors}
    head = tensors.get("output.weight") or tensors["token_embd.weight"]
    return np.asarray(dequantize(head.data, head.tensor_type), dtype=np.float32)[ids]


def callback_context(reference: Any, called: Any) -> tuple[Any, Any, Any, Any]:
    """A context of its own on the reference Llama's model whose evaluation callback is `called(tensor,
    ask, user_data)`, sized and threaded as tokenviz's: (the bindings, ggml's library with the functions a
    callback reads and writes tensors by bound, the callback (kept alive with the context), the context)."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp._ggml import libggml as ggml

    for function in ("ggml_backend_tensor_get", "ggml_backend_tensor_set"):
        getattr(ggml, function).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    ggml.ggml_get_name.argtypes, ggml.ggml_get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    ggml.ggml_nbytes.argtypes, ggml.ggml_nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
    callback = lib.ggml_backend_sched_eval_callback(called)
    params = lib.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512  # (as tokenviz's context)
    params.n_threads = params.n_threads_batch = THREADS
    params.cb_eval = callback
    return lib, ggml, callback, lib.llama_init_from_model(reference.model, params)


def softmax_of_queries_and_keys(
    engine: Any, ids: list[int], layer: int, scale: float, softcap: float = 0.0, window: int = 0
) -> tuple[Any, Any]:
    """The attention rows tokenviz shows at `layer` over `ids` (llama.cpp's kq_soft_max), and softmax(Q·K ×
    `scale`) under the causal mask of the post-rotary queries and keys llama.cpp computed in the same pass
    (rounded to float16, as its kernels multiply them: the KV cache keeps float16): (rows, reference). With
    `softcap`, the logits are capped as llama.cpp's graph does (c · tanh(s / c)); with `window`, a key `window`
    or more positions before its query is masked too (llama_hparams::is_masked_swa, the standard kind)."""
    import torch

    info, internals, n = engine.info, engine.internals, len(ids)
    found = internals.from_empty(internals.attention_context, ids, {f"Qcur-{layer}", f"Kcur-{layer}"})
    q = torch.from_numpy(found[f"Qcur-{layer}"][-1].reshape(n, info.heads, info.head_dim)).half().double()
    k = torch.from_numpy(found[f"Kcur-{layer}"][-1].reshape(n, info.kv_heads, info.head_dim)).half().double()
    k = k.repeat_interleave(info.heads // info.kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    masked = torch.ones(n, n, dtype=torch.bool).triu(1)
    if window:
        back = torch.arange(n).reshape(n, 1) - torch.arange(n).reshape(1, n)  # the query's position minus the key's
        masked |= back >= window
    reference = torch.softmax(scores.masked_fill(masked, float("-inf")), -1)
    return engine.attention(ids, range(n), [layer])[0].double(), reference


def engine_on(model: Path | None = None) -> Any:
    """tokenviz's llama.cpp engine on the GGUF `model` (None: the bundled one), with the reference's threads."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings

    opening = Opening("trace", offloaded(), frozenset(), None if model is None else str(model), SamplingSettings())
    return BACKEND.loader(opening)(lambda message, fraction: None)


def requantized(source: Path, out: Path, kind: str) -> Path:
    """`source` (a quantized GGUF: the bundled one) requantized by llama.cpp's own quantizer to `kind`
    (Q4_K_M, Q8_0...), as `llama-quantize --allow-requantize source out kind` does."""
    import llama_cpp as package

    params = package.llama_model_quantize_default_params()
    params.ftype = getattr(package, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize, params.nthread = True, THREADS
    assert package.llama_model_quantize(os.fsencode(source), os.fsencode(out), params) == 0, (source, kind)
    return out
