"""How much of the machine a prefill may take: its chunk size by device, and a prompt refused before it
runs where its KV cache and working memory would not fit in what is free."""

from __future__ import annotations

from typing import Any

import psutil

from tokenviz.contract.errors import PromptError
from tokenviz.contract.records import ModelInfo

PREFILL_CHUNK = 256  # tokens per forward pass of a long computation cancelled between its passes (verify, watch, score)
# A prompt's prefill is cancelled between the layers of each pass (see Engine.forward), so its passes can
# be longer: on a CPU, 4,096 tokens in 256-token passes took 11.2-14.2 s, in 1,024-token passes 10.5-11.0
# and in one 10.9-11.1 (the bundled model; each pass copies the KV cache grown so far). On an accelerator a
# pass costs its launches more than its tokens (2,048 tokens of the bundled model on an H100: 213 ms in
# 256-token passes, 52 ms in one; 4,096 tokens of its shape on an H200: 70 ms in two passes against
# 25 ms for the bare model's one), and a later pass runs flash attention too (see attention._mask).
PROMPT_CHUNK = 1024
ACCELERATOR_PREFILL_CHUNK = 4096
MEMORY_SHARE = 0.8  # of the free memory, the most a prefill may plan to use


def prefill_chunk(device: Any) -> int:
    """Prompt tokens per forward pass of a prefill on `device` (a torch.device): a Session's, unless it is
    given its own."""
    return PROMPT_CHUNK if device.type == "cpu" else max(PROMPT_CHUNK, ACCELERATOR_PREFILL_CHUNK)


def check_memory(info: ModelInfo, n: int, chunk: int) -> None:
    """Refuse a prompt of `n` tokens whose prefill would not fit in the memory that is free, before it
    hurts: its KV cache, and per chunk the logits of every position and, under eager attention, one
    layer's attention scores (sdpa's kernels never hold them)."""
    width = 4  # bytes per number, float32 at most
    cache = 2 * info.layers * info.kv_heads * info.head_dim * n * width
    scores = 2 * info.heads * n if info.attention.startswith("eager") else 0
    working = min(n, chunk) * (2 * info.vocab + scores) * width
    needed = cache + working
    free = psutil.virtual_memory().available
    if needed > MEMORY_SHARE * free:
        raise PromptError(
            f"a prompt of {n} tokens needs about {needed / 2**30:.1f} GB for its KV cache and working memory, "
            f"and {free / 2**30:.1f} GB is free: shorten it"
        )
