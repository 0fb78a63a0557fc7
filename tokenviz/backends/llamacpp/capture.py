"""Tensors of llama.cpp's graph read, and rows of them written, as it computes them, through its evaluation
callback (llama_context_params.cb_eval): llama.cpp asks the callback, node by node, whether it wants a tensor
(`ask`); for those it wants, the callback is called again once the tensor is computed and before any later
node reads it, and copies it out (ggml_backend_tensor_get, wherever the tensor lives) or writes rows into
it (ggml_backend_tensor_set: a patch, which every later node then reads; or each row read and written back
changed: a clamp of an SAE's feature, which depends on the row). Asked only for what a view shows
or an intervention changes: the residual after each layer (`l_out-L`), the final norm's output
(`result_norm`), with flash attention off the attention probabilities (`kq_soft_max-L`), and an MoE
model's routing (routing.py; the experts as int32, read as the same four bytes an element). llama.cpp's
own examples/eval-callback reads tensors this way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenviz.backends.llamacpp.ggml import tensors


@dataclass(frozen=True)
class RowMap:
    """Every row of a tensor the micro-batch holds, changed: `change(rows (n, width), their positions)`."""

    width: int
    change: Callable[[np.ndarray, np.ndarray], np.ndarray]


Write = tuple[int, np.ndarray] | RowMap  # a row at its position, or every row held changed
Writes = dict[str, tuple[Write, ...]]  # a tensor's name: its writes, in order


class Capture:
    """The evaluation callback of a context: the float32 tensors `wanted` names, each kept as the list of
    its parts (one a micro-batch), between start and stop; and the rows `write` was given, written into the
    tensors they name at the positions they give, in every pass until changed. (llama.cpp asks about each
    node of its graph, about a thousand a step: names are compared as the bytes ggml gives.)"""

    def __init__(self, callback_type: Any):
        self.lib = tensors()
        self.wanted: frozenset[bytes] = frozenset()
        self.parts: dict[str, list[np.ndarray]] = {}
        self._writes: dict[bytes, tuple[Write, ...]] = {}
        self.asked: frozenset[bytes] = frozenset()  # wanted or written
        self.first = 0  # the position of the micro-batch's first token
        self.tokens = 0  # and how many it feeds
        self.outputs: tuple[int, ...] = ()  # the positions in it whose logits are asked (the last layer's rows)
        self.callback = callback_type(self._on_tensor)  # kept alive as long as the context holds it

    def write(self, writes: Writes) -> None:
        """Write these rows in every pass from now on (none: {})."""
        self._writes = {name.encode(): rows for name, rows in writes.items()}
        self.asked = self.wanted | set(self._writes)

    def start(self, wanted: Iterable[str]) -> None:
        self.wanted, self.parts = frozenset(name.encode() for name in wanted), {}
        self.asked = self.wanted | set(self._writes)

    def stop(self) -> dict[str, list[np.ndarray]]:
        """What was captured since start: each tensor's parts (flat float32, one a micro-batch), in order."""
        found, self.parts = self.parts, {}
        self.wanted, self.asked = frozenset(), frozenset(self._writes)
        return found

    def batch(self, first: int, tokens: int, outputs: Sequence[int]) -> None:
        """The micro-batch llama.cpp computes next: `tokens` tokens from position `first`, logits asked
        at the positions `outputs` (where the last layer keeps its rows only)."""
        self.first, self.tokens, self.outputs = first, tokens, tuple(outputs)

    def _on_tensor(self, tensor: int, ask: bool, user_data: int) -> bool:
        lib = self.lib
        name = lib.ggml_get_name(tensor)
        if ask:
            return name in self.asked
        count, size = lib.ggml_nelements(tensor), lib.ggml_nbytes(tensor)
        if size != 4 * count:  # float32: what every tensor asked for is
            return True
        if name in self._writes:
            self._write(tensor, count, self._writes[name])
        if name in self.wanted:
            data = np.empty(count, dtype=np.float32)
            lib.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, size)
            self.parts.setdefault(name.decode("utf-8", "replace"), []).append(data)
        return True

    def _write(self, tensor: int, count: int, writes: tuple[Write, ...]) -> None:
        """Each row at its position, where this micro-batch holds that position: a row per token fed, or
        (the last layer, pruned to its outputs) a row per output; each map over all the rows held."""
        for write in writes:
            if isinstance(write, RowMap):
                self._map(tensor, count, write)
                continue
            position, row = write
            width = row.size
            held = count // width
            if held == self.tokens and self.first <= position < self.first + self.tokens:
                at = position - self.first
            elif held == len(self.outputs) and position in self.outputs:
                at = self.outputs.index(position)
            else:
                continue
            self.lib.ggml_backend_tensor_set(tensor, row.ctypes.data, at * width * 4, width * 4)

    def _map(self, tensor: int, count: int, row_map: RowMap) -> None:
        held = count // row_map.width
        if held == self.tokens:
            positions = np.arange(self.first, self.first + held)
        elif held == len(self.outputs):
            positions = np.asarray(self.outputs)
        else:
            return
        data = np.empty(count, dtype=np.float32)
        self.lib.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, 4 * count)
        changed = np.ascontiguousarray(row_map.change(data.reshape(held, row_map.width), positions), dtype=np.float32)
        self.lib.ggml_backend_tensor_set(tensor, changed.ctypes.data, 0, 4 * count)
