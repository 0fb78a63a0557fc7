"""One model, one DynamicCache: prefill, feed one token, crop. Not thread-safe by design:
exactly one thread (the engine thread, or a script) may own a runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from transformers import DynamicCache

from tokenviz.engine.loading import LoadedModel
from tokenviz.records import Candidate, ModelInfo


@dataclass
class Forward:
    """What one forward pass produced. `logits` stays on the model's device."""

    logits: torch.Tensor  # (vocab,)
    attention: np.ndarray  # float16 (layers, heads, queries, keys)
    ms: float


class ModelRunner:
    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.info: ModelInfo = loaded.info
        self.device = next(self.model.parameters()).device
        self.cache = DynamicCache(config=self.model.config)
        self.special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        self.eos_ids = self._eos_ids()
        self.piece = lru_cache(maxsize=65536)(self._piece)

    def _piece(self, token_id: int) -> str:
        """The exact text a token adds. Byte pieces that are not whole characters show as <0x..>."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in text:
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if raw and "\ufffd" not in raw:
                return _byte_piece(raw)
        return text

    def _eos_ids(self) -> set[int]:
        """The ids that end generation (the generation config's, else the tokenizer's)."""
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return set()
        return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def kv_len(self) -> int:
        return self.cache.get_seq_length()

    @property
    def kv_bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of the cache (transformers 5 wants a negative count)."""
        drop = self.kv_len - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {self.kv_len} up to {length}")
        if length == 0:
            self.reset()
        elif drop:
            self.cache.crop(-drop)

    @torch.inference_mode()
    def forward(self, ids: list[int], attention_dtype: torch.dtype = torch.float16) -> Forward:
        """Feed `ids` after what the cache holds; return the next-token logits and attention
        (kept as `attention_dtype`: float16 for the history, float32 to verify)."""
        started = time.perf_counter()
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(
            input_ids=input_ids,
            past_key_values=self.cache,
            use_cache=True,
            output_attentions=True,
            logits_to_keep=1,
        )
        # One stack and one copy to the CPU for all layers: no per-layer synchronisation.
        attention = torch.cat(out.attentions, 0).to(dtype=attention_dtype).cpu().numpy()
        logits = out.logits[0, -1]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return Forward(logits=logits, attention=attention, ms=(time.perf_counter() - started) * 1000)

    def summarise(self, logits: torch.Tensor, n: int) -> tuple[tuple[Candidate, ...], float]:
        """Top-n of the raw softmax and its entropy in bits, in one transfer."""
        logits = logits.float()
        log_probs = torch.log_softmax(logits, -1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs).nan_to_num().sum() / np.log(2)
        top_logits, top_ids = torch.topk(logits, min(n, logits.numel()))
        packed = torch.stack([top_ids.double(), top_logits.double(), probs[top_ids].double()]).cpu().tolist()
        top = tuple(
            Candidate(id=int(i), text=self.piece(int(i)), logit=lg, prob=p)
            for i, lg, p in zip(*packed)
        )
        return top, float(entropy)


def _byte_piece(raw: str) -> str:
    """Show a byte-level BPE piece that is part of a multi-byte character as its bytes."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = {v: k for k, v in bytes_to_unicode().items()}
    if all(ch in decoder for ch in raw):
        data = bytes(decoder[ch] for ch in raw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in data)
    return raw
