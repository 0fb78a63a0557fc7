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

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenviz.backends.llamacpp.capture import Capture
from tokenviz.backends.llamacpp.ggml_head import Head
from tokenviz.backends.llamacpp.pinned import RESULT_NORM, attention_probabilities, layer_output
from tokenviz.backends.llamacpp.runtime import BATCH, NO_EDITS, Edits, Runtime
from tokenviz.backends.shared.lens_in_use import STEPS_KEPT, LensInUse
from tokenviz.backends.shared.output_head import inspections
from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import Inspection, LensAsk

LENS_CHECK = 1e-3  # the lens's last layer against llama.cpp's own distribution (probability)
NORM_CHECK = 1e-3  # the final norm here against llama.cpp's result_norm (relative to its largest value)


@dataclass(frozen=True)
class StepCapture:
    """What a step's own pass captured for the lens (LlamaInternals.step_names): the tokens its context
    held after it, the edits in force, the tensors (one row each: the step fed one token) and its logits."""

    ids: tuple[int, ...]
    edits: Edits
    found: dict[str, list[np.ndarray]]
    logits: np.ndarray  # (1, vocab)


class LlamaInternals:
    """The lens and attention rows of the model `runtime` runs, on a context of their own."""

    def __init__(self, runtime: Runtime, path: Path, architecture: str, eps: str | None):
        self.runtime, self.path, self.architecture, self.eps = runtime, path, architecture, eps
        self.capture = Capture(runtime.lib.ggml_backend_sched_eval_callback)
        self.edits: Edits = NO_EDITS  # the interventions in force, as llama.cpp takes them
        self.head_checked = False  # the head gave llama.cpp's own distribution once (see _check)
        self.in_use = LensInUse()  # whether steps read the lens's rows in their own pass (step_names)
        self.asked: set[str] = set()  # the tensors the lens last read
        self.steps: deque[StepCapture] = deque(maxlen=STEPS_KEPT)  # what the last steps' passes captured

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
        return Head(self.path, self.architecture, self.eps, self.runtime.threads)

    def names(self, rows: Sequence[int]) -> set[str]:
        """The tensors a lens of `rows` reads: the residual after each of their layers and the last, and the
        final norm's output (checked)."""
        layers = self.runtime.shape.layers
        return {layer_output(row - 1) for row in rows if row > 0} | {layer_output(layers - 1), RESULT_NORM}

    def step_names(self, fed: int) -> set[str]:
        """What a step feeding `fed` tokens captures in its own pass for the lens: while the lens is in use
        (hf.lens_in_use), the tensors it last read, so the lens at that step costs no pass of its own (see
        keep); nothing for a prompt or once the lens is closed, so a step costs what llama.cpp's own decode
        costs."""
        return self.asked if self.in_use.reads_rows(fed) else set()

    def keep(self, ids: Sequence[int], found: dict[str, list[np.ndarray]], logits: np.ndarray) -> None:
        """Keep what a step's pass captured (asked with step_names)."""
        if self.asked <= set(found):
            self.steps.append(StepCapture(tuple(ids), self.edits, found, logits))

    def _from_step(self, ids: Sequence[int], positions: Sequence[int], names: set[str]) -> StepCapture | None:
        """A step's capture that holds the lens of `ids` at `positions`: the last position alone, under the
        edits in force, the tensors `names`."""
        if list(positions) != [len(ids) - 1]:
            return None
        return next(
            (s for s in self.steps if (s.ids, s.edits) == (tuple(ids), self.edits) and names <= set(s.found)), None
        )

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
        stale = context.edits is not edits  # a view's context's cache was computed under its edits: else no use
        if stale:
            context.edit(edits)
        self.capture.write(edits.writes or {})  # the capture is both contexts': its rows are this pass's
        start = 0 if stale else min(shared_prefix(context.held, ids), first, len(ids) - 1)
        context.cut(start)
        self.capture.start(names)
        try:
            logits = context.decode(list(ids[start:]), start, outputs=[o - start for o in outputs])
        finally:
            found = self.capture.stop()
        return logits, found, start

    @torch.inference_mode()
    def residual(self, ids: Sequence[int], layer: int, position: int) -> torch.Tensor:
        """The model's own residual after `layer` at `position` of `ids` (no intervention in force): what
        a steering by texts and a patch's source read."""
        name = layer_output(layer)
        _, found, _ = self._pass(self.lens_context, ids[: position + 1], position, [position], {name}, NO_EDITS)
        if name not in found:
            raise TokenvizError(f"llama.cpp's graph of {self.architecture} has no {name} (the residual after a layer)")
        values = np.concatenate(found[name]).reshape(-1, self.runtime.shape.hidden)
        return torch.from_numpy(values[-1].copy())  # the last layer keeps its output row alone

    @torch.inference_mode()
    def inspect(self, engine: Any, ask: LensAsk) -> list[Inspection]:
        """Each asked position's lens from one pass: llama.cpp's residual after each layer of its rows
        (`l_out-L`, the last layer's always), its final norm checked against llama.cpp's own, and, the first
        time, its distribution too (the head is the model's: a wrong one is wrong at every step)."""
        ids, positions, chosen, pinned = list(ask.ids), list(ask.positions), list(ask.chosen), ask.pinned
        shape = self.runtime.shape
        layers, hidden = shape.layers, shape.hidden
        rows = tuple(range(layers + 1)) if ask.rows is None else ask.rows
        names = self.names(rows)
        self.asked = names
        self.in_use.asked()
        outs = sorted(set(positions))
        step = self._from_step(ids, outs, names)
        if step is not None:
            logits, found, start = step.logits, step.found, len(ids) - 1  # the step's own pass read them
        else:
            logits, found, start = self._pass(self.lens_context, ids, outs[0], outs, names)
        if not names <= set(found):
            raise TokenvizError(f"the lens: llama.cpp's graph of {self.architecture} has no l_out or result_norm")
        at = [outs.index(p) for p in positions]
        fed = [p - start for p in positions]  # the rows of the positions this pass fed

        def after(layer: int) -> torch.Tensor:  # (positions, hidden): the last layer keeps its outputs alone
            values = torch.from_numpy(np.concatenate(found[layer_output(layer)]).reshape(-1, hidden))
            return values[at] if layer == layers - 1 else values[fed]

        embedded = self.head.embeddings([ids[p] for p in positions])
        last = after(layers - 1)
        result_norm = torch.from_numpy(np.concatenate(found[RESULT_NORM]).reshape(-1, hidden))
        self._check(last, result_norm[at], logits[at])
        shown = torch.stack([embedded if row == 0 else last if row == layers else after(row - 1) for row in rows])
        here = list(range(len(positions)))
        local = [ids[p] for p in positions]
        own = torch.from_numpy(logits[at])  # the last row: llama.cpp's own logits, which its head gives
        made = inspections(
            shown, local, here, chosen, pinned, self.head.logits, embedded, engine, rows=rows, last_logits=own
        )
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
        logits, _, _ = self._pass(self.lens_context, ids, 0, [len(ids) - 1], set())  # first 0: from empty
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
        names = {attention_probabilities(layer): i for i, layer in enumerate(layers)}
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
