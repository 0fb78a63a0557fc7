"""Tensors of llama.cpp's graph read, and rows of them written, as it computes them, through its evaluation
callback (llama_context_params.cb_eval): llama.cpp asks the callback, node by node, whether it wants a tensor
(`ask`); for those it wants, the callback is called again once the tensor is computed and before any later
node reads it, and copies it out (ggml_backend_tensor_get, wherever the tensor lives) or writes rows into
it (ggml_backend_tensor_set: a patch, which every later node then reads). Asked only for what a view shows
or an intervention changes: the residual after each layer (`l_out-L`), the final norm's output
(`result_norm`) and, with flash attention off, the attention probabilities (`kq_soft_max-L`). llama.cpp's
own examples/eval-callback reads tensors this way.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_GGML: list[Any] = []

Writes = dict[str, tuple[tuple[int, np.ndarray], ...]]  # a tensor's name: (position, its row there) each


def ggml() -> Any:
    """The ggml library llama-cpp-python loaded, with the signatures the callback calls."""
    if not _GGML:
        from llama_cpp._ggml import libggml as lib

        lib.ggml_get_name.argtypes, lib.ggml_get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
        lib.ggml_nbytes.argtypes, lib.ggml_nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
        lib.ggml_nelements.argtypes, lib.ggml_nelements.restype = [ctypes.c_void_p], ctypes.c_int64
        for name in ("ggml_backend_tensor_get", "ggml_backend_tensor_set"):
            function = getattr(lib, name)
            function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
            function.restype = None
        _GGML.append(lib)
    return _GGML[0]


class Capture:
    """The evaluation callback of a context: the float32 tensors whose names `wanted` accepts, each kept
    as the list of its parts (one a micro-batch), between start and stop; and `writes`, rows written into
    the tensors they name at the positions they give, in every pass until changed."""

    def __init__(self, callback_type: Any):
        self.lib = ggml()
        self.wanted: Callable[[str], bool] = lambda name: False
        self.parts: dict[str, list[np.ndarray]] = {}
        self.writes: Writes = {}
        self.first = 0  # the position of the micro-batch's first token
        self.tokens = 0  # and how many it feeds
        self.outputs: tuple[int, ...] = ()  # the positions in it whose logits are asked (the last layer's rows)
        self.callback = callback_type(self._called)  # (kept alive as long as the context holds it)

    def start(self, wanted: Callable[[str], bool]) -> None:
        self.wanted, self.parts = wanted, {}

    def stop(self) -> dict[str, list[np.ndarray]]:
        """What was captured since start: each tensor's parts (flat float32, one a micro-batch), in order."""
        found, self.wanted, self.parts = self.parts, (lambda name: False), {}
        return found

    def batch(self, first: int, tokens: int, outputs: Sequence[int]) -> None:
        """The micro-batch llama.cpp computes next: `tokens` tokens from position `first`, logits asked
        at the positions `outputs` (where the last layer keeps its rows only)."""
        self.first, self.tokens, self.outputs = first, tokens, tuple(outputs)

    def _called(self, tensor: int, ask: bool, user_data: int) -> bool:
        lib = self.lib
        name = (lib.ggml_get_name(tensor) or b"").decode("utf-8", "replace")
        if ask:
            return name in self.writes or self.wanted(name)
        count, size = lib.ggml_nelements(tensor), lib.ggml_nbytes(tensor)
        if size != 4 * count:  # (float32: what every tensor asked for is)
            return True
        if name in self.writes:
            self._write(tensor, count, self.writes[name])
        if self.wanted(name):
            data = np.empty(count, dtype=np.float32)
            lib.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, size)
            self.parts.setdefault(name, []).append(data)
        return True

    def _write(self, tensor: int, count: int, rows: tuple[tuple[int, np.ndarray], ...]) -> None:
        """Each row at its position, where this micro-batch holds that position: a row per token fed, or
        (the last layer, pruned to its outputs) a row per output."""
        for position, row in rows:
            width = row.size
            held = count // width
            if held == self.tokens and self.first <= position < self.first + self.tokens:
                at = position - self.first
            elif held == len(self.outputs) and position in self.outputs:
                at = self.outputs.index(position)
            else:
                continue
            self.lib.ggml_backend_tensor_set(tensor, row.ctypes.data, at * width * 4, width * 4)
