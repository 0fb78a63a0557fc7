"""Which rows of the logit lens a view shows (`--lens-layers`): a served model's lens costs bytes in
proportion to the layers it asks for, so a view that shows fewer asks for fewer.

A row is what --ablate and the panes call a layer, counted from 0, plus `emb` for the embeddings:
`emb`, `N`, `N-M` (both ends in), `N-M/K` (every K-th from N), `last`, joined by commas. Row numbers in
an Inspection count the embeddings as 0 (row i follows decoder layer i - 1).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text, shortened

_ITEM = re.compile(r"(?:(emb)|(last)|([0-9]{1,6})(?:-([0-9]{1,6})(?:/([0-9]{1,6}))?)?)")
EXAMPLE = "emb,0-29/4,last"


@dataclass(frozen=True)
class LensLayers:
    """A checked `--lens-layers` choice; `rows(layers)` resolves it against a model with `layers` layers."""

    spec: str

    @staticmethod
    def of_rows(rows: Iterable[int]) -> LensLayers:
        """The choice of exactly these Inspection rows (a saved lens's `layer` numbers)."""
        return parse_lens_layers(",".join("emb" if row == 0 else str(row - 1) for row in rows if row >= 0))

    def rows(self, layers: int) -> tuple[int, ...]:
        """The Inspection rows chosen (0: the embeddings, i: after layer i - 1), in order, each once."""
        chosen: set[int] = set()
        for item in self.spec.split(","):
            found = _ITEM.fullmatch(item.strip())
            assert found is not None  # parse_lens_layers checked the spec
            emb, last, start, stop, step = found.groups()
            if emb or last:
                chosen.add(0 if emb else layers)
                continue
            first = int(start)
            end = first if stop is None else int(stop)
            if end >= layers:
                raise TokenvizError(
                    f"--lens-layers {safe_text(item.strip())}: the model's layers are 0 to {layers - 1} (and emb)"
                )
            chosen.update(layer + 1 for layer in range(first, end + 1, int(step or 1)))
        return tuple(sorted(chosen))


def spread(rows: Sequence[int], room: int) -> tuple[int, ...]:
    """At most `room` of `rows`, spaced evenly from the first to the last (both among them where there is
    room for two; the last alone where there is room for one): what a lens view of `room` lines shows of a
    model deeper than that, its whole depth at a glance."""
    if room >= len(rows):
        return tuple(rows)
    if room < 2:
        return (rows[-1],) if room == 1 else ()
    last = len(rows) - 1
    return tuple(dict.fromkeys(rows[round(i * last / (room - 1))] for i in range(room)))


def parse_lens_layers(spec: str) -> LensLayers:
    """`spec` checked for its form (the layer count is checked once the model is known)."""
    for item in spec.split(","):
        found = _ITEM.fullmatch(item.strip())
        if found is None:
            raise TokenvizError(
                f"--lens-layers {safe_text(shortened(item.strip(), 30))!r}: give emb, last, N, N-M or N-M/K "
                f"joined by commas (as {EXAMPLE})"
            )
        _, _, start, stop, step = found.groups()
        if stop is not None and int(stop) < int(start):
            raise TokenvizError(f"--lens-layers {item.strip()}: a range goes from the lower layer up")
        if step is not None and int(step) == 0:
            raise TokenvizError(f"--lens-layers {item.strip()}: a step of 0 chooses nothing")
    return LensLayers(spec)
