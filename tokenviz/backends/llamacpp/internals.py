"""Inside a GGUF as llama.cpp runs it: the logit lens and attention rows, read through the evaluation
callback (capture.py) on contexts of their own (the journey's cache is left alone), asked only while a
view shows them: a step with no internal view open costs what llama.cpp's own decode costs.

The lens reads each layer's residual (`l_out-L`) through the model's own final norm and head (ggml_head);
its last layer is checked against llama.cpp's own final norm (`result_norm`) and distribution, so an
architecture whose output does more than an RMS norm and a head is refused in one line, not shown wrong.
Its passes are shaped as the journey's were (Runtime.shaped): llama.cpp's numbers depend on a pass's shape,
and the lens's last layer must be the step's own distribution. Attention rows are llama.cpp's own probabilities
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
from tokenviz.backends.llamacpp.runtime import BATCH, NO_EDITS, Edits, Runtime, cells_reused
from tokenviz.backends.shared.lens_in_use import STEPS_KEPT, LensInUse
from tokenviz.backends.shared.output_head import inspections
from tokenviz.contract.engine import IsCancelled, Residuals, shared_prefix
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import Inspection, LensAsk

LENS_CHECK = 1e-3  # the lens's last layer against llama.cpp's own distribution (probability)
NORM_CHECK = 1e-3  # the final norm here against llama.cpp's result_norm (relative to its largest value)


class Rows:
    """What passes computed at each position: the tensors captured (a row for each token fed, or, for those
    llama.cpp computes at its outputs alone, the last layer's, a row for each output) and the logits at the
    outputs. A position fed again (a pass replayed whole, then cut) keeps its last."""

    def __init__(self, hidden: int):
        self.hidden = hidden
        self.tensors: dict[str, dict[int, np.ndarray]] = {}
        self.logits: dict[int, np.ndarray] = {}

    def add(
        self, start: int, count: int, outputs: Sequence[int], logits: np.ndarray, found: dict[str, list[np.ndarray]]
    ) -> None:
        """One pass's: `count` tokens from `start`, logits (and the last layer's rows) at `outputs`."""
        for name, parts in found.items():
            values = np.concatenate(parts).reshape(-1, self.hidden)
            positions = range(start, start + count) if len(values) == count else outputs
            if len(values) != len(positions):
                continue  # (a tensor of another shape: not one a view reads)
            self.tensors.setdefault(name, {}).update(zip(positions, values))
        self.logits.update(zip(outputs, logits))

    def names(self) -> set[str]:
        return set(self.tensors)

    def at(self, name: str, positions: Sequence[int]) -> torch.Tensor:
        """(positions, hidden) of tensor `name`."""
        return torch.from_numpy(np.stack([self.tensors[name][p] for p in positions]))

    def logits_at(self, positions: Sequence[int]) -> np.ndarray:
        return np.stack([self.logits[p] for p in positions])


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

    def _from_step(self, ids: Sequence[int], positions: Sequence[int], names: set[str]) -> Rows | None:
        """What a step's own pass captured of the lens of `ids` at `positions`: the last position alone, under
        the edits in force, the tensors `names`."""
        if list(positions) != [len(ids) - 1]:
            return None
        step = next(
            (s for s in self.steps if (s.ids, s.edits) == (tuple(ids), self.edits) and names <= set(s.found)), None
        )
        if step is None:
            return None
        rows = Rows(self.runtime.shape.hidden)
        rows.add(len(ids) - 1, 1, [len(ids) - 1], step.logits, step.found)
        return rows

    def _under(self, context: Runtime, edits: Edits) -> bool:
        """`context` and the capture set to run under `edits`; whether the context ran under others (its
        cache was computed under them: no use now)."""
        stale = context.edits is not edits
        if stale:
            context.edit(edits)
        self.capture.write(edits.writes or {})  # the capture is both contexts': its rows are this pass's
        return stale

    def _pass(
        self,
        context: Runtime,
        ids: Sequence[int],
        first: int,
        outputs: Sequence[int],
        names: set[str],
        edits: Edits | None = None,
    ) -> Rows:
        """Passes over `ids` on `context`, shaped as the journey's were (Runtime.shaped: llama.cpp's numbers
        depend on a pass's shape, by 0.07 in a probability on a K-quant), with logits at `outputs`
        (positions), capturing `names`, with `edits` (by default those in force): from the pass that holds
        position `first` (0: from an empty cache). The cells before it are the context's own where it
        holds them as the journey's passes made them, else the journey's, copied."""
        edits = self.edits if edits is None else edits
        stale = self._under(context, edits)
        journey = self.runtime
        plan = journey.shaped(ids)
        begin = max(k for k, fed in enumerate(plan) if fed.start <= first)
        reused = 0 if stale else cells_reused(context.passes, len(context.held), plan, begin)
        agreed = shared_prefix(journey.held, ids)
        if reused < begin and journey.edits is edits and plan[begin].start <= agreed:
            reused = begin if context.take_cells(journey, plan[begin].start) else 0
        asked = set(outputs)
        rows = Rows(self.runtime.shape.hidden)
        context.cut(plan[reused].start)
        for k in range(reused, len(plan)):
            fed = plan[k]
            stop = plan[k + 1].start if k + 1 < len(plan) else len(ids)
            wanted = sorted(set(fed.outputs) | {p - fed.start for p in asked if fed.start <= p < stop})
            context.cut(fed.start)
            self.capture.start(names)
            try:
                logits = context.decode(fed.tokens, fed.start, outputs=wanted)
            finally:
                found = self.capture.stop()
            rows.add(fed.start, len(fed.tokens), [fed.start + i for i in wanted], logits, found)
        if len(context.held) > len(ids):
            context.cut(len(ids))
        return rows

    @torch.inference_mode()
    def residual(self, ids: Sequence[int], layer: int, position: int, edits: Edits = NO_EDITS) -> torch.Tensor:
        """The residual after `layer` at `position` of `ids`, under `edits` (by default none: the model's own,
        what a steering by texts and a patch's source read), from passes shaped as the journey's."""
        return self.residuals(ids, layer, [position], edits)[0]

    @torch.inference_mode()
    def residuals(self, ids: Sequence[int], layer: int, positions: Sequence[int], edits: Edits) -> torch.Tensor:
        """The residual after `layer` at each of `positions` of `ids`, under `edits`: (positions, hidden)."""
        name = layer_output(layer)
        outs = sorted(set(positions))
        rows = self._pass(self.lens_context, ids[: outs[-1] + 1], outs[0], outs, {name}, edits)
        if name not in rows.names():
            raise TokenvizError(f"llama.cpp's graph of {self.architecture} has no {name} (the residual after a layer)")
        return rows.at(name, list(positions)).clone()

    @torch.inference_mode()
    def inspect(self, engine: Any, ask: LensAsk) -> list[Inspection]:
        """Each asked position's lens from passes shaped as the journey's (its last layer is so the step's
        own distribution): llama.cpp's residual after each layer of its rows (`l_out-L`, the last layer's
        always), its final norm checked against llama.cpp's own, and, the first time, its distribution too
        (the head is the model's: a wrong one is wrong at every step)."""
        ids, positions, chosen, pinned = list(ask.ids), list(ask.positions), list(ask.chosen), ask.pinned
        layers = self.runtime.shape.layers
        rows = tuple(range(layers + 1)) if ask.rows is None else ask.rows
        names = self.names(rows)
        self.asked = names
        self.in_use.asked()
        outs = sorted(set(positions))
        found = self._from_step(ids, outs, names) or self._pass(self.lens_context, ids, outs[0], outs, names)
        if not names <= found.names():
            raise TokenvizError(f"the lens: llama.cpp's graph of {self.architecture} has no l_out or result_norm")
        logits = found.logits_at(positions)
        embedded = self.head.embeddings([ids[p] for p in positions])
        last = found.at(layer_output(layers - 1), positions)
        self._check(last.numpy(), found.at(RESULT_NORM, positions).numpy(), logits)
        shown = torch.stack(
            [
                embedded if row == 0 else last if row == layers else found.at(layer_output(row - 1), positions)
                for row in rows
            ]
        )
        here = list(range(len(positions)))
        local = [ids[p] for p in positions]
        own = torch.from_numpy(logits)  # the last row: llama.cpp's own logits, which its head gives
        made = inspections(
            shown, local, here, chosen, pinned, self.head.logits, embedded, engine, rows=rows, last_logits=own
        )
        return [replace(inspection, position=p) for inspection, p in zip(made, positions)]

    def _check(self, last: np.ndarray, result_norm: np.ndarray, logits: np.ndarray) -> None:
        """Refuse a lens that is not llama.cpp's own at its last layer: the norm, then (once) the distribution."""
        largest = float(np.abs(result_norm).max(initial=0.0))
        if np.abs(self.head.normed(last) - result_norm).max(initial=0.0) > NORM_CHECK * max(largest, 1.0):
            raise TokenvizError(
                f"the lens of {self.architecture} in llama.cpp is not exact: its final norm is not an RMS norm "
                "with a weight (its output does more)"
            )
        if self.head_checked:
            return
        ours = torch.softmax(self.head.logits(torch.from_numpy(last)), -1)
        theirs = torch.softmax(torch.from_numpy(logits), -1)
        if (ours - theirs).abs().max() > LENS_CHECK:
            raise TokenvizError(
                f"the lens of {self.architecture} in llama.cpp is not exact: its last layer is "
                f"{float((ours - theirs).abs().max()):.2g} from the model's distribution"
            )
        self.head_checked = True

    def scores_kept(
        self, context: Runtime, ids: Sequence[int], first: int, kept: bool = True
    ) -> tuple[np.ndarray, torch.Tensor]:
        """One pass over `ids` from an empty cache on `context` (a text scored alone), under the edits in force,
        logits asked after each of `ids[first:]`; with `kept`, the residual after each layer at those positions
        captured in the same pass, (layers, positions, hidden), the last layer's final norm checked against
        llama.cpp's own (and, once, its distribution). Without, an empty stream."""
        layers, outputs = self.runtime.shape.layers, list(range(first, len(ids)))
        names = {layer_output(layer) for layer in range(layers)} | {RESULT_NORM} if kept else set()
        self._under(context, self.edits)
        context.clear()
        self.capture.start(names)
        try:
            logits = context.decode(list(ids), 0, outputs=outputs)
        finally:
            found = self.capture.stop()
        if not kept:
            return logits, torch.empty(0)
        rows = Rows(self.runtime.shape.hidden)
        rows.add(0, len(ids), outputs, logits, found)
        if not names <= rows.names():
            raise TokenvizError(f"the lens: llama.cpp's graph of {self.architecture} has no l_out or result_norm")
        stream = torch.stack([rows.at(layer_output(layer), outputs) for layer in range(layers)])
        self._check(stream[-1].numpy(), rows.at(RESULT_NORM, outputs).numpy(), logits)
        return logits, stream

    @torch.inference_mode()
    def lens_of(self, engine: Any, kept: Residuals, chosen: Sequence[int]) -> list[Inspection]:
        """The lens at each position `kept` holds (scores_kept's stream), every row, as `inspect` reads it."""
        embedded = self.head.embeddings(list(kept.tokens))
        shown = torch.cat([embedded[None], kept.stream])
        here = list(range(len(kept.tokens)))
        rows = tuple(range(self.runtime.shape.layers + 1))
        return inspections(
            shown, list(kept.tokens), here, list(chosen), (), self.head.logits, embedded, engine, rows=rows,
            last_logits=kept.scores,
        )  # fmt: skip

    def logits_after(self, ids: Sequence[int], start: int) -> torch.Tensor:
        """llama.cpp's logits after each of `ids[start:]`, (positions, vocab), from the views' context (the
        journey's cache is not touched), fed as the journey's passes were."""
        outputs = list(range(start, len(ids)))
        return torch.from_numpy(self._pass(self.lens_context, ids, start, outputs, set()).logits_at(outputs))

    def recompute(
        self, ids: Sequence[int], progress: Callable[[int, int], None], cancelled: Callable[[], bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole of `ids` again from an empty cache, in passes shaped as the journey's (so the cache is
        held to numbers it should equal bit for bit): llama.cpp's logits after the last, and its attention
        row of the last position at every layer, (layers, heads, len(ids)). (llama_decode cannot stop
        inside a pass, so `cancelled` is asked before them.)"""
        if cancelled():
            raise Cancelled("verify cancelled")
        progress(0, 2)
        last = len(ids) - 1
        logits = self._pass(self.lens_context, ids, 0, [last], set()).logits_at([last])  # first 0: from empty
        progress(1, 2)
        if cancelled():
            raise Cancelled("verify cancelled")
        rows = self.attention(ids, range(len(ids) - 1, len(ids)), range(self.runtime.shape.layers))[:, :, 0]
        progress(2, 2)
        return torch.from_numpy(logits[-1].copy()), rows

    def from_empty(self, context: Runtime, ids: Sequence[int], names: set[str]) -> dict[str, list[np.ndarray]]:
        """The tensors `names` of one pass over `ids` from an empty cache on `context`, under the edits in
        force: each as its parts, one a micro-batch of BATCH tokens from position 0."""
        self._under(context, self.edits)
        context.clear()
        self.capture.start(names)
        try:
            context.decode(list(ids), 0)
        finally:
            found = self.capture.stop()
        return found

    @torch.inference_mode()
    def attention(
        self, ids: Sequence[int], rows: range, layers: Sequence[int], cancelled: IsCancelled = None
    ) -> torch.Tensor:
        """llama.cpp's own attention probabilities of positions `rows` at `layers`:
        (layers, heads, len(rows), rows.stop), 0 past each row's position. A pass from position 0: the
        probabilities' columns are the cache's cells, which are positions in a cache filled from empty.
        `cancelled()` True stops the pass between two of its graph's nodes (llama.cpp's abort callback)."""
        heads, stop = self.runtime.shape.heads, rows.stop
        names = {attention_probabilities(layer): i for i, layer in enumerate(layers)}
        context = self.attention_context
        with context.stopping_when(cancelled):
            found = self.from_empty(context, ids[:stop], set(names))
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
