"""What the llama.cpp tests hold tokenviz to: llama-cpp-python's own public API on the bundled GGUF, run
outside tokenviz with the same prompt and threads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenviz.backends.llamacpp.runtime import default_threads

PROMPT = "The Eiffel Tower is located in"
# Both sides compute with the same threads (llama.cpp splits its sums by thread): tokenviz's default, one
# a worker under the test command's workers (conftest's OMP_NUM_THREADS), where more would spin-wait.
THREADS = default_threads()


def own_llama(flash_attn: bool = True) -> Iterator[Any]:
    """llama-cpp-python's own Llama on the bundled GGUF, with the model parameters tokenviz gives it (on a CPU
    with AMX, llama.cpp's AMX kernel crashes on Q4_1: both run without the extra buffer types)."""
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
            model_path=str(bundled_gguf()),
            n_ctx=4096,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            logits_all=True,
            flash_attn=flash_attn,
            verbose=False,  # (llama.cpp's own default on a CPU: auto, on)
        )
    finally:
        bindings.llama_model_default_params = default


def greedy_session(steps: int) -> Any:
    """A greedy journey of `steps` tokens on the bundled GGUF in tokenviz's llama.cpp backend."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    greedy = SamplingSettings(temperature=0)
    opening = Opening("trace", {"threads": THREADS}, frozenset(), None, greedy)
    session = Session(BACKEND.loader(opening)(lambda message, fraction: None), greedy)
    session.start(PROMPT)
    for _ in range(steps):
        session.step()
    return session
