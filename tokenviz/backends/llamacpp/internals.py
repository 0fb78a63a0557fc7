"""Inside a GGUF as llama.cpp runs it: the logit lens and attention rows, read through the evaluation
callback (capture.py) on contexts of their own (the journey's cache is left alone), asked only while a
view shows them: a step with no internal view open costs what llama.cpp's own decode costs.

The lens reads each layer's residual (`l_out-L`) through the model's own final norm and head, read from
the GGUF and dequantized once (float32); its last layer is checked against llama.cpp's own final norm
(`result_norm`) and distribution, so an architecture whose output does more than an RMS norm and a
head is refused in one line, not shown wrong. Attention rows are llama.cpp's own probabilities
(`kq_soft_max-L`) from a pass with flash attention off: the steps' own pass (flash attention on, as
llama.cpp runs a CPU model by default) fuses them and keeps none. Both see the model as the journey's
steps do: with the interventions in force (`edits`, set by interventions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenviz.backends.hf.output_head import inspections
from tokenviz.backends.llamacpp.capture import Capture
from tokenviz.backends.llamacpp.runtime import BATCH, NO_EDITS, Edits, Runtime
from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import Inspection, LensAsk

LENS_CHECK = 1e-3  # the lens's last layer against llama.cpp's own distribution (probability)
NORM_CHECK = 1e-3  # the final norm here against llama.cpp's result_norm (relative to its largest value)


def as_multiplied(weight_type: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activations as llama.cpp's CPU kernels multiply them with weights of `weight_type`: quantized to
    8 bits in blocks of 32 (the Q4_0 to Q8_0 family's Q8_0/Q8_1) or 256 (the K and IQ quants' Q8_K),
    rounded to float16 or bfloat16 for those weights, as they are for float32 ones. (The lens's head
    applied so gives llama.cpp's own distribution within 2e-4 on the bundled Q4_1 model; applied in
    float32, 0.008 off.)"""
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


@dataclass(frozen=True)
class Head:
    """The model's final RMS norm and its unembedding, dequantized from the GGUF, applied as llama.cpp
    applies them (the activations as its kernels multiply them)."""

    norm: torch.Tensor  # (hidden,)
    eps: float
    weight: torch.Tensor  # (vocab, hidden) float32
    embeddings: torch.Tensor  # (vocab, hidden): the token embeddings (the head itself where tied)
    multiplied: Callable[[torch.Tensor], torch.Tensor]

    def normed(self, residual: torch.Tensor) -> torch.Tensor:
        r = residual.float()
        return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm

    def logits(self, residual: torch.Tensor) -> torch.Tensor:
        return self.multiplied(self.normed(residual)) @ self.weight.T


def read_head(path: Path, architecture: str, eps: str | None) -> Head:
    from gguf import GGUFReader, dequantize

    tensors = {t.name: t for t in GGUFReader(path).tensors}
    if "output_norm.weight" not in tensors or "token_embd.weight" not in tensors:
        raise TokenvizError(f"the lens: {path.name} has no output_norm or token_embd tensor ({architecture})")

    def read(name: str) -> torch.Tensor:
        t = tensors[name]
        return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))

    embeddings = read("token_embd.weight")
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    weight = embeddings if head == "token_embd.weight" else read(head)
    multiplied = as_multiplied(tensors[head].tensor_type.name)
    return Head(read("output_norm.weight").reshape(-1), float(eps or 1e-5), weight, embeddings, multiplied)


class LlamaInternals:
    """The lens and attention rows of the model `runtime` runs, on a context of their own."""

    def __init__(self, runtime: Runtime, path: Path, architecture: str, eps: str | None):
        self.runtime, self.path, self.architecture, self.eps = runtime, path, architecture, eps
        self.capture = Capture(runtime.lib.ggml_backend_sched_eval_callback)
        self.edits: Edits = NO_EDITS  # the interventions in force, as llama.cpp takes them
        self._edits_of: dict[int, Edits] = {}  # the edits each context's cache was computed under, by id
        self.head_checked = False  # the head gave llama.cpp's own distribution once (see _check)

    @cached_property
    def lens_context(self) -> Runtime:
        """The lens's: flash attention as the journey's own context has it (so its last layer is the
        steps' distribution: on this model, flash attention on or off moves a probability by 0.02)."""
        return self.runtime.sibling(self.capture)

    @cached_property
    def attention_context(self) -> Runtime:
        """The attention rows': flash attention off (with it on, llama.cpp keeps no probabilities)."""
        return self.runtime.sibling(self.capture, flash_attention=False)

    @cached_property
    def head(self) -> Head:
        return read_head(self.path, self.architecture, self.eps)

    def _pass(
        self,
        context: Runtime,
        ids: Sequence[int],
        first: int,
        outputs: Sequence[int],
        names: set[str],
        edits: Edits | None = None,
    ) -> tuple[np.ndarray, dict[str, list[np.ndarray]], int]:
        """A pass over `ids` on `context` with logits at `outputs` (positions), capturing `names`, with
        `edits` (by default those in force): from position `first` on, where the context's cache holds
        `ids` that far under the same edits (a lens at the step just taken feeds that step alone), else
        from further back (`first` 0: from an empty cache). (logits, the tensors captured, the position the
        pass began at)."""
        edits = self.edits if edits is None else edits
        stale = self._edits_of.get(id(context)) is not edits  # (a cache computed under other edits is no use)
        if stale:
            context.edit(edits)
            self._edits_of[id(context)] = edits
        self.capture.writes = edits.writes or {}  # (the capture is both contexts': its rows are this pass's)
        start = 0 if stale else min(shared_prefix(context.held, ids), first, len(ids) - 1)
        context.cut(start)
        self.capture.start(lambda name: name in names)
        try:
            logits = context.decode(list(ids[start:]), start, outputs=[o - start for o in outputs])
        finally:
            found = self.capture.stop()
        return logits, found, start

    @torch.inference_mode()
    def residual(self, ids: Sequence[int], layer: int, position: int) -> torch.Tensor:
        """The model's own residual after `layer` at `position` of `ids` (no intervention in force): what
        a steering by texts and a patch's source read."""
        name = f"l_out-{layer}"
        _, found, _ = self._pass(self.lens_context, ids[: position + 1], position, [position], {name}, NO_EDITS)
        if name not in found:
            raise TokenvizError(f"llama.cpp's graph of {self.architecture} has no {name} (the residual after a layer)")
        values = np.concatenate(found[name]).reshape(-1, self.runtime.shape.hidden)
        return torch.from_numpy(values[-1].copy())  # (the last layer keeps its output row alone)

    @torch.inference_mode()
    def inspect(self, engine: Any, ask: LensAsk) -> list[Inspection]:
        """Each asked position's lens from one pass: llama.cpp's residual after each layer of its rows
        (`l_out-L`, the last layer's always), its final norm checked against llama.cpp's own, and, the first
        time, its distribution too (the head is the model's: a wrong one is wrong at every step)."""
        ids, positions, chosen, pinned = list(ask.ids), list(ask.positions), list(ask.chosen), ask.pinned
        shape = self.runtime.shape
        layers, hidden = shape.layers, shape.hidden
        rows = tuple(range(layers + 1)) if ask.rows is None else ask.rows
        captured = sorted({row - 1 for row in rows if row > 0} | {layers - 1})
        outs = sorted(set(positions))
        names = {f"l_out-{i}" for i in captured} | {"result_norm"}
        logits, found, start = self._pass(self.lens_context, ids, outs[0], outs, names)
        if len(found) != len(names):
            raise TokenvizError(f"the lens: llama.cpp's graph of {self.architecture} has no l_out or result_norm")
        at = [outs.index(p) for p in positions]
        fed = [p - start for p in positions]  # (the rows of the positions this pass fed)

        def after(layer: int) -> torch.Tensor:  # (positions, hidden): the last layer keeps its outputs alone
            values = torch.from_numpy(np.concatenate(found[f"l_out-{layer}"]).reshape(-1, hidden))
            return values[at] if layer == layers - 1 else values[fed]

        embedded = self.head.embeddings[[ids[p] for p in positions]]
        last = after(layers - 1)
        result_norm = torch.from_numpy(np.concatenate(found["result_norm"]).reshape(-1, hidden))
        self._check(last, result_norm[at], logits[at])
        shown = torch.stack([embedded if row == 0 else last if row == layers else after(row - 1) for row in rows])
        here = list(range(len(positions)))
        local = [ids[p] for p in positions]
        made = inspections(shown, local, here, chosen, pinned, self.head.logits, embedded, engine, rows=rows)
        return [replace(inspection, position=p) for inspection, p in zip(made, positions)]

    def _check(self, last: torch.Tensor, result_norm: torch.Tensor, logits: np.ndarray) -> None:
        """Refuse a lens that is not llama.cpp's own at its last layer: the norm, then (once) the distribution."""
        normed = self.head.normed(last)
        if (normed - result_norm).abs().max() > NORM_CHECK * max(float(result_norm.abs().max()), 1.0):
            raise TokenvizError(
                f"the lens of {self.architecture} in llama.cpp is not exact: its final norm is not an RMS norm "
                "with a weight (its output does more)"
            )
        if self.head_checked:
            return
        ours = torch.softmax(self.head.logits(last), -1)
        theirs = torch.softmax(torch.from_numpy(logits), -1)
        if (ours - theirs).abs().max() > LENS_CHECK:
            raise TokenvizError(
                f"the lens of {self.architecture} in llama.cpp is not exact: its last layer is "
                f"{float((ours - theirs).abs().max()):.2g} from the model's distribution"
            )
        self.head_checked = True

    def logits_after(self, ids: Sequence[int], start: int) -> torch.Tensor:
        """llama.cpp's logits after each of `ids[start:]`, (positions, vocab), from the views' context (the
        journey's cache is not touched): it feeds what it does not hold of `ids` already."""
        outputs = list(range(start, len(ids)))
        logits, _, _ = self._pass(self.lens_context, ids, start, outputs, set())
        return torch.from_numpy(logits)

    def recompute(
        self, ids: Sequence[int], progress: Callable[[int, int], None], cancelled: Callable[[], bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole of `ids` again from an empty cache: llama.cpp's logits after the last, and its attention
        row of the last position at every layer, (layers, heads, len(ids)). (One pass: llama_decode cannot
        stop inside one, so `cancelled` is asked before it.)"""
        if cancelled():
            raise Cancelled("verify cancelled")
        progress(0, 2)
        logits, _, _ = self._pass(self.lens_context, ids, 0, [len(ids) - 1], set())  # (first 0: from empty)
        progress(1, 2)
        if cancelled():
            raise Cancelled("verify cancelled")
        rows = self.attention(ids, range(len(ids) - 1, len(ids)), range(self.runtime.shape.layers))[:, :, 0]
        progress(2, 2)
        return torch.from_numpy(logits[-1].copy()), rows

    @torch.inference_mode()
    def attention(self, ids: Sequence[int], rows: range, layers: Sequence[int]) -> torch.Tensor:
        """llama.cpp's own attention probabilities of positions `rows` at `layers`:
        (layers, heads, len(rows), rows.stop), 0 past each row's position. A pass from position 0: the
        probabilities' columns are the cache's cells, which are positions in a cache filled from empty."""
        heads, stop = self.runtime.shape.heads, rows.stop
        names = {f"kq_soft_max-{layer}": i for i, layer in enumerate(layers)}
        _, found, _ = self._pass(self.attention_context, list(ids[:stop]), 0, [stop - 1], set(names))
        if len(found) != len(names):
            raise TokenvizError(f"llama.cpp's graph of {self.architecture} has no kq_soft_max (its attention rows)")
        out = torch.zeros(len(layers), heads, len(rows), stop)
        for name, i in names.items():
            for part, first in zip(found[name], range(0, stop, BATCH)):
                queries = min(BATCH, stop - first)
                keys = part.size // (heads * queries)
                block = torch.from_numpy(part.reshape(heads, queries, keys))[:, :, :stop]
                for q in range(first, first + queries):
                    if q in rows:
                        out[i, :, q - rows.start, : block.shape[-1]] = block[:, q - first]
        return out
