"""Quantized weights, through transformers' own quantization configs: `--quantize int8` is torchao's
int8 weight-only (it runs on a CPU too); `int4` is bitsandbytes' 4-bit, or torchao's int4, on a CUDA
GPU. A checkpoint already quantized (a quantization_config in its config.json) loads as transformers
loads it. The numbers on screen are the quantized model's own."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from tokenviz.contract.errors import ModelLoadError

INT4_PACKING = "tile_packed_to_4d"


def quantization_config(kind: str, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import BitsAndBytesConfig, TorchAoConfig

    if kind == "int4" and device.type != "cuda":
        raise ModelLoadError(
            "--quantize int4 needs a CUDA GPU (its kernels are CUDA's); on this device try --quantize int8"
        )
    if kind == "int4" and importlib.util.find_spec("bitsandbytes"):
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
    if not importlib.util.find_spec("torchao"):
        raise ModelLoadError(f"--quantize {kind} needs torchao: pip install torchao")
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig

    if kind == "int8":
        return TorchAoConfig(Int8WeightOnlyConfig())
    # Packed for tinygemm, the int4 kernel inside PyTorch itself (torchao's default packing needs
    # another package's kernels); it takes bfloat16 activations.
    if dtype != torch.bfloat16:
        raise ModelLoadError(f"--quantize int4 computes in bfloat16, not {str(dtype).removeprefix('torch.')}: "
                             "pass --dtype bfloat16 (or leave --dtype out)")  # fmt: skip
    return TorchAoConfig(Int4WeightOnlyConfig(int4_packing_format=INT4_PACKING))


def quantized(model: Any) -> str:
    """How the model's weights are quantized, in a few words ('' when they are not)."""
    config = getattr(model.config, "quantization_config", None)
    if config is None:
        return ""
    raw = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    method = str(getattr(raw, "value", raw))
    if method == "torchao":
        name = type(getattr(config, "quant_type", None)).__name__
        bits = "int8" if "Int8" in name else "int4" if "Int4" in name else "quantized"
        return f"{bits} weights (torchao {name}); activations in the model's dtype"
    if method == "bitsandbytes":
        bits = "int4" if getattr(config, "load_in_4bit", False) else "int8"
        return f"{bits} weights (bitsandbytes); activations in the model's dtype"
    width = config.get("bits") if isinstance(config, dict) else getattr(config, "bits", None)
    return f"int{width} weights ({method})" if width else f"quantized weights ({method})"
