"""The exact attention weights of rows of the journey's cached path (contract.engine.AttentionRows).

Under tokenviz's fast attention, each row is the model's eager attention computed from the query states
kept as the pass ran (a QueryStore, within its memory budget) and the cached keys; rows whose queries are
no longer kept are fed again over the cache cut before them. A model without the fast path runs an eager
pass of the rows, its last answer kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tokenviz.backends.shared.parts import last_logits
from tokenviz.backends.transformers.attention import IMPLEMENTATION, capturing, exact_weights
from tokenviz.backends.transformers.cache import cut_cache, with_cache
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.backends.transformers.memory import free_bytes, gigabytes
from tokenviz.backends.transformers.query_store import QUERY_SHARE, QueryStore, query_budget
from tokenviz.contract.errors import TokenvizError
from tokenviz.tensors.transfer import ids_to_device


class ExactAttention:
    def __init__(self, access: ModelAccess, query_bytes: int, cache_layers: list[int | None]):
        """`query_bytes`: one position's query states, every layer's; `cache_layers`: the cache layer that
        holds each decoder layer's keys (see runner.cache_layers)."""
        self.access = access
        self.fast = access.model.config._attn_implementation == IMPLEMENTATION
        self.queries = QueryStore(query_budget(free_bytes(access.device, {})[0], query_bytes), query_bytes)
        self._cache_layers = cache_layers
        self._eager_rows: tuple[range, torch.Tensor] | None = None  # the last rows an eager pass gave

    def kept(self) -> str:
        """What the query states' budget holds, in positions (see query_store)."""
        if not self.fast:
            return "none: the attention view runs an eager pass of the rows it shows"
        positions = self.queries.positions
        return (
            f"the last {positions:,} positions ({gigabytes(self.queries.budget)}, at most {QUERY_SHARE:.0%} of the "
            "free memory); rows further back are fed again when shown"
        )

    def forget_from(self, position: int) -> None:
        """Positions from `position` on may be fed differently now: their kept queries and rows go."""
        self.queries.drop_from(position)
        if self._eager_rows is not None and self._eager_rows[0].stop > position:
            self._eager_rows = None

    @torch.inference_mode()
    def weights(self, ids: Sequence[int], rows: range, layers: Sequence[int]) -> torch.Tensor:
        """The weights of positions `rows` of the cached path `ids`, for `layers`: (layers, heads,
        len(rows), rows.stop) in float32, on the device. The cache is left as it was."""
        cache = self.access.cache
        if not 0 <= rows.start < rows.stop <= cache.get_seq_length():
            raise ValueError(f"rows {rows.start}-{rows.stop - 1} are not all in the cache of {cache.get_seq_length()}")
        if not self.fast:
            return self._eager(ids, rows)[list(layers)]
        missing = self.queries.missing(rows)
        if missing:  # from the first one missing to the end (the rows before it are kept)
            self._feed_again(ids, range(missing[0], rows.stop))
            if self.queries.missing(rows):  # the budget dropped older ones for them: all, one block it keeps
                self._feed_again(ids, rows)
        out = []
        for layer in layers:
            held = self._cache_layers[layer]
            if held is None:
                raise TokenvizError(f"layer {layer} attends over keys its cache does not hold: no rows to show")
            cached: Any = cache.layers[held]  # a GrowingLayer: see full_cache
            keys, values = cached.keys[0, :, : rows.stop], cached.values[0, :, : rows.stop]
            call = self.queries.calls[layer]
            out.append(exact_weights(call, self.queries.get(layer, rows), rows, keys, values).float())
        return torch.stack(out)

    def _feed_again(self, ids: Sequence[int], span: range) -> None:
        """Keep the query states of positions `span` of the cached path `ids`, fed again over the cache
        cut before them (which is left as it was)."""
        model, cache, device = self.access.model, self.access.cache, self.access.device
        with cut_cache(cache, span.start), capturing(calls=self.queries.calls) as capture:
            model(
                input_ids=ids_to_device(ids[span.start : span.stop], device),
                **with_cache(model, cache),
                use_cache=True,
                logits_to_keep=last_logits(len(span), device),
            )
        self.queries.add(span.start, capture)

    def _eager(self, ids: Sequence[int], rows: range) -> torch.Tensor:
        """Every layer's rows from an eager forward pass of those positions (for models without the
        fast path). The last answer is kept: a layer switch costs nothing, and when the rows move on
        by a few positions (autoplay) only the new ones are fed."""
        kept = self._eager_rows
        if kept is not None and kept[0].start <= rows.start and rows.stop <= kept[0].stop:
            return kept[1][:, :, rows.start - kept[0].start : rows.stop - kept[0].start, : rows.stop]
        start, parts = rows.start, []
        if kept is not None and kept[0].start <= rows.start < kept[0].stop:
            old = kept[1][:, :, rows.start - kept[0].start :]
            parts.append(torch.nn.functional.pad(old, (0, rows.stop - old.shape[-1])))  # the future: 0
            start = kept[0].stop
        model, cache, device = self.access.model, self.access.cache, self.access.device
        with cut_cache(cache, start):
            out = model(
                input_ids=ids_to_device(ids[start : rows.stop], device),
                **with_cache(model, cache),
                use_cache=True,
                output_attentions=True,
                logits_to_keep=1,
            )
        parts.append(torch.cat([a.float() for a in out.attentions], 0))
        self._eager_rows = (rows, torch.cat(parts, 2))
        return self._eager_rows[1]
