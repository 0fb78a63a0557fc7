"""The model's final norm and output head as llama.cpp computes them, for the lens: a graph of ggml's own
CPU kernels (rms_norm, mul, mul_mat) on the GGUF's weights as they are in the file, so the lens's last
layer is llama.cpp's own logits (bit for bit on the bundled model) and its rows cost what llama.cpp's head
costs: the bundled model's Q8_0 head reads 30 MB a pass, against 113 MB dequantized to float32, and nothing
is held: the matrix is read where the file is mapped (the pages llama.cpp's own mapping reads). Rows of the
embeddings and of the head (the lens's row 0, a steering by tokens) are dequantized as read. Where the ggml
library has no CPU graph of tokenviz's own to compute (ggml.graphs), the head is dequantized once and
applied in float32 as llama.cpp's kernels round its activations.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenviz.backends.llamacpp.ggml import ALIGNMENT, F32, InitParams, graphs
from tokenviz.contract.errors import TokenvizError

GRAPH_ROOM = 1 << 20  # bytes a head's graph may take beyond its tensors (the activations quantized, padding)


def as_multiplied(weight_type: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activations as llama.cpp's CPU kernels multiply them with weights of `weight_type`: quantized to
    8 bits in blocks of 32 (the Q4_0 to Q8_0 family's Q8_0/Q8_1) or 256 (the K and IQ quants' Q8_K),
    rounded to float16 or bfloat16 for those weights, as they are for float32 ones. (The float head so
    gives llama.cpp's own distribution within 2e-4 on the bundled Q4_1 model; without, 0.008 off.)"""
    name = weight_type.upper()
    if name in ("F32", "F64"):
        return lambda x: x
    if name in ("F16", "BF16"):
        dtype = torch.float16 if name == "F16" else torch.bfloat16
        return lambda x: x.to(dtype).float()
    block = 256 if "_K" in name or (name.startswith("IQ") and name != "IQ4_NL") else 32

    def quantized(x: torch.Tensor) -> torch.Tensor:
        blocks = x.reshape(*x.shape[:-1], -1, block)
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        steps = torch.round(blocks / torch.where(scale == 0, torch.ones_like(scale), scale))
        return (steps * scale).reshape(x.shape)

    return quantized


def rms_normed(residual: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
    r = residual.float()
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * norm


class GgmlHead:
    """The final RMS norm (its weight) in a ggml context of its own and the head's matrix as the GGUF holds
    it, where the file is mapped: the same pages llama.cpp's own mapping of the file reads (where it maps
    it), so the lens holds no copy of a head of hundreds of megabytes. Each call computes (rows, vocab)
    logits in a graph of its own."""

    def __init__(self, lib: Any, norm: np.ndarray, eps: float, matrix: Any, threads: int):
        self.lib, self.eps, self.threads = lib, eps, threads
        self.raw = _aligned(matrix.data)  # (kept: the matrix's data)
        self.hidden, self.vocab = (int(n) for n in matrix.shape[:2])
        overhead = int(lib.ggml_tensor_overhead())
        self.ctx = lib.ggml_init(InitParams(norm.nbytes + 2 * overhead, None, False))  # (the norm alone)
        self.mapped = lib.ggml_init(InitParams(2 * overhead, None, True))  # (no_alloc: the data is the file's)
        if not self.ctx or not self.mapped:
            raise TokenvizError("the lens: ggml could not make room for the head")
        self.matrix = lib.ggml_new_tensor_2d(self.mapped, int(matrix.tensor_type), self.hidden, self.vocab)
        self.norm = lib.ggml_new_tensor_1d(self.ctx, F32, self.hidden)
        if lib.ggml_nbytes(self.matrix) != self.raw.nbytes or norm.size != self.hidden:
            raise TokenvizError(f"the lens: the GGUF's {matrix.name} is not the size its type and shape say")
        address = self.raw.ctypes.data
        self.buffer = lib.ggml_backend_cpu_buffer_from_ptr(address, self.raw.nbytes)
        if not self.buffer or lib.ggml_backend_tensor_alloc(self.buffer, self.matrix, address) != 0:
            raise TokenvizError(f"the lens: ggml could not read the GGUF's {matrix.name} where it is mapped")
        weight = np.ascontiguousarray(norm, dtype=np.float32)
        ctypes.memmove(lib.ggml_get_data(self.norm), weight.ctypes.data, weight.nbytes)

    def __del__(self) -> None:
        for name, free in (("ctx", "ggml_free"), ("mapped", "ggml_free"), ("buffer", "ggml_backend_buffer_free")):
            if getattr(self, name, None):
                getattr(self.lib, free)(getattr(self, name))

    def logits(self, residual: torch.Tensor) -> torch.Tensor:
        """(rows, hidden) residuals through the norm and head: (rows, vocab) float32, as llama.cpp's, where
        ggml wrote them (the graph's memory is a numpy array's, which the logits keep: no copy)."""
        lib, hidden = self.lib, self.hidden
        x = np.ascontiguousarray(residual.detach().float().cpu().numpy().reshape(-1, hidden))
        rows = x.shape[0]
        size = 4 * rows * (4 * hidden + self.vocab) + 8 * int(lib.ggml_tensor_overhead())
        memory = _aligned_room(size + int(lib.ggml_graph_overhead()) + GRAPH_ROOM)
        ctx = lib.ggml_init(InitParams(memory.nbytes, memory.ctypes.data, False))  # (ggml_free leaves it)
        if not ctx:
            raise TokenvizError(f"the lens: ggml could not make room for {rows} rows")
        try:
            inputs = lib.ggml_new_tensor_2d(ctx, F32, hidden, rows)
            ctypes.memmove(lib.ggml_get_data(inputs), x.ctypes.data, x.nbytes)
            normed = lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, inputs, self.eps), self.norm)
            out = lib.ggml_mul_mat(ctx, self.matrix, normed)
            graph = lib.ggml_new_graph(ctx)
            lib.ggml_build_forward_expand(graph, out)
            status = lib.ggml_graph_compute_with_ctx(ctx, graph, self.threads)
            if status != 0:
                raise TokenvizError(f"the lens: ggml could not compute the head (status {status})")
            start = lib.ggml_get_data(out) - memory.ctypes.data
        finally:
            lib.ggml_free(ctx)
        return torch.from_numpy(memory[start : start + 4 * rows * self.vocab].view(np.float32).reshape(rows, -1))


def _aligned(data: np.ndarray) -> np.ndarray:
    """`data` where it lies (a GGUF's tensors are aligned to 32 bytes unless the file says otherwise), else
    a copy at an address ggml's CPU buffers take."""
    if data.flags.c_contiguous and data.ctypes.data % ALIGNMENT == 0:
        return data
    copy = _aligned_room(data.nbytes).view(data.dtype).reshape(data.shape)
    copy[...] = data
    return copy


def _aligned_room(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialised bytes at an address aligned as ggml asks of its contexts and CPU buffers."""
    room = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -room.ctypes.data % ALIGNMENT
    return room[start : start + nbytes]


class FloatHead:
    """The head dequantized to float32 once, applied as llama.cpp's kernels round the activations: where
    ggml's CPU graph is out of reach (within 2e-4 of llama.cpp's distribution on the bundled model)."""

    def __init__(self, norm: np.ndarray, eps: float, matrix: Any):
        from gguf import dequantize

        self.norm, self.eps = torch.from_numpy(norm), eps
        self.weight = torch.from_numpy(np.array(dequantize(matrix.data, matrix.tensor_type), dtype=np.float32))
        self.multiplied = as_multiplied(matrix.tensor_type.name)

    def logits(self, residual: torch.Tensor) -> torch.Tensor:
        return self.multiplied(rms_normed(residual, self.norm, self.eps)) @ self.weight.T


class Head:
    """The model's final RMS norm and head, read from the GGUF, applied as llama.cpp applies them; its
    embedding and head rows dequantized as asked."""

    def __init__(self, path: Path, architecture: str, eps: str | None, threads: int, ggml_graphs: bool = True):
        from gguf import GGUFReader

        tensors = {t.name: t for t in GGUFReader(path).tensors}  # the file mapped, not read
        if "output_norm.weight" not in tensors or "token_embd.weight" not in tensors:
            raise TokenvizError(f"the lens: {path.name} has no output_norm or token_embd tensor ({architecture})")
        self.embedding = tensors["token_embd.weight"]
        self.matrix = tensors.get("output.weight", self.embedding)  # the embeddings themselves where tied
        norm = np.array(tensors["output_norm.weight"].data, dtype=np.float32).reshape(-1)
        self.norm, self.eps = torch.from_numpy(norm), float(eps or 1e-5)
        lib = graphs() if ggml_graphs else None
        self.apply: GgmlHead | FloatHead = (
            GgmlHead(lib, norm, self.eps, self.matrix, threads)
            if lib is not None
            else FloatHead(norm, self.eps, self.matrix)
        )

    def normed(self, residual: np.ndarray) -> np.ndarray:
        """The final RMS norm alone of (rows, hidden) residuals, in float32 and numpy (what the lens checks
        against llama.cpp's result_norm at each step: a dozen torch operators there cost 0.3 ms)."""
        r = residual.astype(np.float32, copy=False)
        scale = 1 / np.sqrt(np.square(r).mean(-1, keepdims=True) + np.float32(self.eps))
        normed: np.ndarray = r * scale * self.norm.numpy()
        return normed

    def logits(self, residual: torch.Tensor) -> torch.Tensor:
        """(rows, hidden) residuals through the final norm and head: (rows, vocab) float32."""
        return self.apply.logits(residual)

    def embeddings(self, ids: Sequence[int]) -> torch.Tensor:
        """The embedding rows of `ids`, (len(ids), hidden) float32."""
        return _rows(self.embedding, ids)

    def unembeddings(self, ids: Sequence[int]) -> torch.Tensor:
        """The head's rows of `ids`, (len(ids), hidden) float32."""
        return _rows(self.matrix, ids)


def _rows(tensor: Any, ids: Sequence[int]) -> torch.Tensor:
    from gguf import dequantize

    data = np.asarray(tensor.data)[list(ids)]
    return torch.from_numpy(np.array(dequantize(data, tensor.tensor_type), dtype=np.float32).reshape(len(ids), -1))
