"""A GGUF of a larger model's shape for the llama.cpp measures: the bundled GGUF's tokenizer and chat
template, its vocabulary padded to the shape's own size with reserved control tokens (as Llama 3 reserves
its last 256: the head and the per-token work over the vocabulary are the real model's), a body of the
shape's layers with random weights, quantized to Q4_1 (as the bundled model is) by llama.cpp's own
quantizer. The bundled model's decode is 8-9 ms on a 2-core CPU, shorter than any model a person runs, so
the engine's fixed work a token weighs more there than it ever does on their models; this file shows it at
a size they run, made in a minute or two with no download and kept in the user cache."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

# Llama 3.2 1B's shape: its layers, widths, heads and vocabulary (tied embeddings, as its own).
GGUF_SHAPES = {"1B": dict(layers=16, hidden=2048, ffn=8192, heads=32, kv_heads=8, vocab=128_256)}
RESERVED = "<|reserved_special_token_{}|>"  # the padding tokens' text (Llama 3's name for its own)
CONTROL = 3  # llama.cpp's token type for a control token: never made by tokenizing text
SEED = 0


def shaped_gguf(shape: dict[str, int], folder: Path) -> Path:
    """The Q4_1 GGUF of `shape` in `folder` (made once: a file already there is taken as it is)."""
    import gguf
    import llama_cpp

    from tokenviz.system.paths import bundled_gguf

    layers, hidden, ffn, heads, kv_heads = (shape[k] for k in ("layers", "hidden", "ffn", "heads", "kv_heads"))
    source = gguf.GGUFReader(bundled_gguf())
    tokens = list(source.fields["tokenizer.ggml.tokens"].contents())
    vocab = max(shape.get("vocab", len(tokens)), len(tokens))
    name = f"random-{layers}x{hidden}-ffn{ffn}-h{heads}-kv{kv_heads}-v{vocab}"
    done = folder / f"{name}.Q4_1.gguf"
    if done.is_file():
        return done
    folder.mkdir(parents=True, exist_ok=True)
    padding = range(vocab - len(tokens))
    shaped = {
        "tokenizer.ggml.tokens": tokens + [RESERVED.format(i) for i in padding],
        "tokenizer.ggml.token_type": list(source.fields["tokenizer.ggml.token_type"].contents())
        + [CONTROL for _ in padding],
        "llama.block_count": layers,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.dimension_count": hidden // heads,
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_F16),
        "general.name": name,
        "general.size_label": "random",
    }
    f16 = folder / f"{name}.F16.gguf.tmp"
    writer = gguf.GGUFWriter(f16, "llama")
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":  # (the writer's own)
            continue
        kind = field.types[0]
        inner = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, shaped.get(key, field.contents()), kind, inner)
    rng = np.random.default_rng(SEED)

    def weights(rows: int, columns: int) -> np.ndarray:
        return (rng.standard_normal((rows, columns), dtype=np.float32) * 0.02).astype(np.float16)

    head_dim = hidden // heads
    writer.add_tensor("token_embd.weight", weights(vocab, hidden))  # (tied: the head too, as the bundled model's)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for layer in range(layers):
        block = f"blk.{layer}."
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"{block}{norm}.weight", np.ones(hidden, np.float32))
        for part, rows, columns in (
            ("attn_q", hidden, hidden),
            ("attn_k", kv_heads * head_dim, hidden),
            ("attn_v", kv_heads * head_dim, hidden),
            ("attn_output", hidden, hidden),
            ("ffn_gate", ffn, hidden),
            ("ffn_up", ffn, hidden),
            ("ffn_down", hidden, ffn),
        ):
            writer.add_tensor(f"{block}{part}.weight", weights(rows, columns))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    partial = done.with_suffix(".tmp")
    try:
        status = llama_cpp.llama_model_quantize(os.fsencode(f16), os.fsencode(partial), ctypes.byref(params))
        if status != 0:
            raise RuntimeError(f"llama.cpp could not quantize {f16.name} (status {status})")
        partial.replace(done)
    finally:
        f16.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return done
