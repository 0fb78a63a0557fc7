"""How much of the machine a prefill may take: its passes' size, and a prompt refused before it runs
where its KV cache and working memory would not fit in what is free."""

from __future__ import annotations

import psutil

from tokenviz.contract.errors import PromptError
from tokenviz.contract.records import ModelInfo

PREFILL_CHUNK = 256  # tokens per forward pass of a long computation cancelled between its passes (verify, watch, score)
# A prompt's prefill is cancelled between the layers of each pass (see Engine.forward), so its passes can
# be long, and a pass after the first is slower: sdpa's causal kernel serves one pass alone, and a later
# one, whose queries come after the cache's keys, takes a mask (on a GPU a causal bias from the bottom
# right, which runs flash attention: see attention._mask; on a CPU the masked kernel). The bundled model
# on a 2-core CPU: 2,048 tokens in one pass 3.80 s, in two 4.35 s (the bare forward 3.88 s); 4,096
# tokens in one 9.69 s, in two or four 11.5 s (9.63 s); on an H100, 2,048 tokens in 256-token passes
# took 213 ms, in one 52 ms. A longer prompt goes in passes of this many, the working memory they need
# planned by check_memory.
PROMPT_CHUNK = 4096
MEMORY_SHARE = 0.8  # of the free memory, the most a prefill may plan to use


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
