"""What each view that shows an on-demand result asks the worker for, and when: one spec per view.

A view open on the cursor's position asks for its result when the snapshot lacks it; the spec says
the request and the key that must change before it asks again (the same request is not sent twice).
The screen keeps the keys asked and runs the one confirmation a request may need (a long
leave-one-out attribution asks first: see JourneyScreen._request_view).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from tokenviz.contract.commands import Attribute, Inspect, LabelFeatures, ReadFeatures, Request, SplitDifference
from tokenviz.contract.engine import Capability, refusal_of
from tokenviz.contract.results import AttributionMethod
from tokenviz.ui.panes.attribution import current_attribution
from tokenviz.ui.panes.features import current_features
from tokenviz.ui.panes.lens import current_inspection, every_lens_row, lens_rows_shown
from tokenviz.ui.panes.watch import current_difference
from tokenviz.ui.selection import Selection

Fetched = Inspect | Attribute | SplitDifference | ReadFeatures | LabelFeatures
Wanted = tuple[Fetched, Hashable] | None  # the request, and what must change before it is sent again


@dataclass(frozen=True)
class Room:
    """What the views' requests depend on besides the selection: the attribution's method, the lens
    rows the lens pane has room for."""

    method: AttributionMethod = "loo"
    lens_rows: int = 0


@dataclass(frozen=True)
class ViewFetch:
    """One view's fetch policy: `wanted(selection, room)` is the request the view needs now, or None."""

    kind: type[Request[Any]]  # the request's kind: a cancelled one leaves the view open, its key runs it again
    wanted: Callable[[Selection, Room], Wanted]


def _inspection_of(selection: Selection, rows: tuple[int, ...]) -> Wanted:
    """The inspection at the cursor holding the lens `rows` (every one the lens may show: asked as None)."""
    s = selection.snapshot
    shown = current_inspection(selection)
    if s.playing or not s.live or not rows or (shown is not None and shown.holds(rows)):
        return None
    request = Inspect(position=selection.cursor, rows=None if rows == every_lens_row(selection) else rows)
    return request, (s.seq, selection.cursor, request.rows)


def _lens(selection: Selection, room: Room) -> Wanted:
    """The rows the lens pane shows (lens_rows_shown): its cost follows the pane's size."""
    return _inspection_of(selection, lens_rows_shown(selection, room.lens_rows))


def _embedding(selection: Selection, room: Room) -> Wanted:
    """Every row's residual norm (the lens's rows chosen, or every layer's)."""
    return _inspection_of(selection, every_lens_row(selection))


def _attribution(selection: Selection, room: Room) -> Wanted:
    """The token after the cursor, by the chosen method (a recording answers with what its file kept)."""
    if selection.snapshot.playing or selection.following_id is None:
        return None
    shown = current_attribution(selection)
    request = Attribute(position=selection.cursor, method=room.method)
    if shown is not None and shown.method == room.method:
        return None
    return request, request


def _difference(selection: Selection, room: Room) -> Wanted:
    """The logit difference of the two tokens watched last after the cursor, split by layer."""
    s = selection.snapshot
    if s.playing or len(s.pinned) < 2 or current_difference(selection) is not None:
        return None
    if refusal_of(selection.info, Capability.LOGIT_SPLIT, "the logit split") is not None:
        return None  # the watch view says so: a served model's layers are the server's
    request = SplitDifference(position=selection.cursor)
    return request, (request, s.pinned[-2:])


def _features(selection: Selection, room: Room) -> Wanted:
    """Every SAE loaded, read at the cursor's position (once: a refusal, such as no SAE loaded, is not asked
    again until the journey, the interventions or the cursor change, or the view is opened again); then the
    labels of the features it shows (a second request: a label reads the whole head, after the frame)."""
    s = selection.snapshot
    if s.playing or not s.live:
        return None
    read = current_features(selection)
    if read is not None:  # then the labels of the features it shows, where the snapshot lacks one
        labelled = s.result(LabelFeatures)
        shown = read.shown()
        if not shown or (labelled is not None and all(labelled.label_of(*f) for f in shown)):
            return None
        labels = LabelFeatures(features=shown)
        return labels, labels
    request = ReadFeatures(position=selection.cursor)
    ids = tuple(chip.id for chip in s.chips[: selection.cursor + 1])
    return request, (request, ids, s.interventions)  # asked again where the model changed (E: opened again)


VIEW_FETCHES: dict[str, ViewFetch] = {  # by the view's widget id
    "lens": ViewFetch(Inspect, _lens),
    "embedding": ViewFetch(Inspect, _embedding),
    "attribution": ViewFetch(Attribute, _attribution),
    "watch": ViewFetch(SplitDifference, _difference),
    "features": ViewFetch(ReadFeatures, _features),
}
