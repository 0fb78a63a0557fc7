"""One model, one DynamicCache: prefill, feed one token, crop. Not thread-safe by design:
exactly one thread (the engine thread, or a script) may own a runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import torch

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.text import safe_text
from tokenviz.model.cache import full_cache
from tokenviz.model.loading import LoadedModel
from tokenviz.model.transfer import DeviceTimer, ids_to_device


@dataclass
class Forward:
    """What one forward pass produced, still on the model's device: the caller copies what it
    needs to the host in one transfer (see tokenviz.model.transfer)."""

    logits: torch.Tensor  # (vocab,): after the last token fed
    attention: torch.Tensor  # (layers, heads, queries, keys), every layer stacked in one tensor
    timer: DeviceTimer
    position_logits: torch.Tensor | None = None  # (tokens fed, vocab), when every position's were asked for


class ModelRunner:
    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = next(self.model.parameters()).device
        self.info: ModelInfo = self._with_cache_shape(loaded.info)
        self.cache = full_cache()
        self.special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        self.eos_ids = self._eos_ids()
        self.piece = lru_cache(maxsize=65536)(self._piece)

    @torch.inference_mode()
    def _with_cache_shape(self, info: ModelInfo) -> ModelInfo:
        """`info` with the key/value heads and head size the KV cache really holds, from a one-token
        forward pass: configs name them in many ways (grouped- and multi-query, Falcon's num_kv_heads).
        It runs here, in the thread that owns the runner: on a CPU, a thread that runs the model first
        keeps its speed, and the app's engine thread is that thread."""
        cache = full_cache()
        self.model(
            input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), past_key_values=cache, use_cache=True
        )
        keys = getattr(cache.layers[0], "keys", None)
        if not isinstance(keys, torch.Tensor):
            raise ModelLoadError(f"{type(self.model).__name__} keeps no key/value cache that tokenviz can read")
        return dataclasses.replace(info, kv_heads=int(keys.shape[1]), head_dim=int(keys.shape[-1]))

    def _piece(self, token_id: int) -> str:
        """The exact text a token adds, safe to print. Byte pieces that are not whole characters, and
        control characters but newline and tab, show as <0x..>."""
        text = self.decode([token_id])
        if "\ufffd" in text:
            raw = str(self.tokenizer.convert_ids_to_tokens(token_id))
            if raw and "\ufffd" not in raw:
                return safe_text(_byte_piece(raw))
        return safe_text(text)

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

    def decode(self, ids: Iterable[int]) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return cast(str, text)  # a list of ids decodes to one string

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
        self.cache = full_cache()

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
    def forward(
        self, ids: list[int], attention_dtype: torch.dtype = torch.float16, every_position: bool = False
    ) -> Forward:
        """Feed `ids` after what the cache holds; return the next-token logits and attention
        (as `attention_dtype`: float16 for the history, float32 to verify), and with `every_position`
        the logits after each of `ids`. Nothing waits for the device."""
        timer = DeviceTimer(self.device)
        input_ids = ids_to_device(ids, self.device)
        out = self.model(
            input_ids=input_ids,
            past_key_values=self.cache,
            use_cache=True,
            output_attentions=True,
            logits_to_keep=len(ids) if every_position else 1,
        )
        # One stacked tensor for all layers, so the copy to the host is one piece, not one per layer.
        # Each layer is converted before stacking: stacking a long prompt's float32 squares first
        # costs more than the forward pass (measured: 5.2 s against 0.6 s for 1500 tokens).
        attention = torch.cat([layer.to(dtype=attention_dtype) for layer in out.attentions], 0)
        return Forward(
            logits=out.logits[0, -1],
            attention=attention,
            timer=timer.stop(),
            position_logits=out.logits[0] if every_position else None,
        )

    @torch.inference_mode()
    def recompute(self, ids: list[int]) -> Forward:
        """A full forward pass over `ids` without the cache (the cache is untouched): the next-token
        logits and, in float32, the last position's attention row of every layer."""
        timer = DeviceTimer(self.device)
        out = self.model(
            input_ids=ids_to_device(ids, self.device), use_cache=False, output_attentions=True, logits_to_keep=1
        )
        attention = torch.cat([layer[:, :, -1:, :].float() for layer in out.attentions], 0)
        return Forward(logits=out.logits[0, -1], attention=attention, timer=timer.stop())


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
