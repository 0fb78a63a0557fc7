"""The ggml library llama-cpp-python loaded (llama.cpp's tensor library), with the signatures tokenviz
calls: reading and writing a tensor of llama.cpp's graph by name (capture.py), and a small graph of its own
computed by ggml's CPU kernels (head.py). Bound once, on first use.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tokenviz.backends.llamacpp import pinned

_BOUND: dict[str, Any] = {}

POINTER = ctypes.c_void_p
Signatures = dict[str, tuple[list[Any], Any]]  # a function's name: (its arguments' types, its result's)
F32 = 0  # ggml_type's float32 (its numbering is the GGUF's tensor types')
ALIGNMENT = 32  # the bytes a tensor's data in a ggml CPU buffer is aligned to (ggml-backend's TENSOR_ALIGNMENT)


class InitParams(ctypes.Structure):
    """ggml_init_params: the memory a ggml context allocates its tensors and graphs in."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_TENSORS: Signatures = {  # (arguments, result) of what the capture reads and writes
    "ggml_get_name": ([POINTER], ctypes.c_char_p),
    "ggml_nbytes": ([POINTER], ctypes.c_size_t),
    "ggml_nelements": ([POINTER], ctypes.c_int64),
    "ggml_backend_tensor_get": ([POINTER, POINTER, ctypes.c_size_t, ctypes.c_size_t], None),
    "ggml_backend_tensor_set": ([POINTER, POINTER, ctypes.c_size_t, ctypes.c_size_t], None),
}

_GRAPHS: Signatures = {  # and what a graph of tokenviz's own takes
    "ggml_init": ([InitParams], POINTER),
    "ggml_free": ([POINTER], None),
    "ggml_tensor_overhead": ([], ctypes.c_size_t),
    "ggml_graph_overhead": ([], ctypes.c_size_t),
    "ggml_new_tensor_1d": ([POINTER, ctypes.c_int, ctypes.c_int64], POINTER),
    "ggml_new_tensor_2d": ([POINTER, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], POINTER),
    "ggml_get_data": ([POINTER], POINTER),
    "ggml_rms_norm": ([POINTER, POINTER, ctypes.c_float], POINTER),
    "ggml_mul": ([POINTER, POINTER, POINTER], POINTER),
    "ggml_mul_mat": ([POINTER, POINTER, POINTER], POINTER),
    "ggml_new_graph": ([POINTER], POINTER),
    "ggml_build_forward_expand": ([POINTER, POINTER], None),
    "ggml_graph_compute_with_ctx": ([POINTER, POINTER, ctypes.c_int], ctypes.c_int),
    "ggml_backend_cpu_buffer_from_ptr": ([POINTER, ctypes.c_size_t], POINTER),
    "ggml_backend_tensor_alloc": ([POINTER, POINTER, POINTER], ctypes.c_int),
    "ggml_backend_buffer_free": ([POINTER], None),
}


def _bound(which: str, signatures: Signatures) -> Any:
    if which not in _BOUND:
        lib = pinned.ggml_library()
        for name, (arguments, result) in signatures.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = arguments, result
        _BOUND[which] = lib
    return _BOUND[which]


def tensors() -> Any:
    """The library, bound for reading and writing the tensors of llama.cpp's graph."""
    return _bound("tensors", _TENSORS)


def graphs() -> Any | None:
    """The library, bound for graphs of tokenviz's own on ggml's CPU kernels; None where it has none (a
    build that loads its CPU backend at run time keeps them out of reach)."""
    try:
        return _bound("graphs", {**_TENSORS, **_GRAPHS})
    except AttributeError:
        return None
