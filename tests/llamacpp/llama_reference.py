"""What the llama.cpp tests hold tokenviz to: llama-cpp-python's own public API on the bundled GGUF, run
outside tokenviz with the same prompt and threads."""

from __future__ import annotations

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


def pin() -> str:
    """The llama-cpp-python requirement of tokenviz's `llamacpp` extra (pyproject.toml: one place)."""
    for requirement in requires("tokenviz") or ():
        if requirement.startswith("llama-cpp-python") and re.search(r"extra == [\"']llamacpp[\"']", requirement):
            return re.split(r"\s*;", requirement)[0]
    raise AssertionError("tokenviz declares no llamacpp extra")


def own_llama(flash_attn: bool = True, path: Path | None = None) -> Iterator[Any]:
    """llama-cpp-python's own Llama on the GGUF at `path` (the bundled one by default), with the model
    parameters tokenviz gives it (on a CPU with AMX, llama.cpp's AMX kernel crashes on Q4_1: both run
    without the extra buffer types)."""
    import llama_cpp as package
    import llama_cpp.llama_cpp as bindings

    from tokenviz.backends.llamacpp.runtime import amx_present
    from tokenviz.system.paths import bundled_gguf

    default = bindings.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = not amx_present()
        return p

    bindings.llama_model_default_params = params
    try:
        yield package.Llama(
            model_path=str(path or bundled_gguf()),
            n_ctx=4096,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            logits_all=True,
            flash_attn=flash_attn,
            verbose=False,  # (llama.cpp's own default on a CPU: auto, on)
        )
    finally:
        bindings.llama_model_default_params = default


def greedy_session(steps: int, model: str | None = None) -> Any:
    """A greedy journey of `steps` tokens on the GGUF `model` names (None: the bundled one) in tokenviz's
    llama.cpp backend."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    greedy = SamplingSettings(temperature=0)
    opening = Opening("trace", {"threads": THREADS}, frozenset(), model, greedy)
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
