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

from tokenviz.contract.commands import Attribute, Inspect, Request, SplitDifference
from tokenviz.contract.engine import Capability, lacking
from tokenviz.contract.results import AttributionMethod
from tokenviz.ui.panes.attribution import current_attribution
from tokenviz.ui.panes.lens import current_inspection
from tokenviz.ui.panes.watch import current_difference
from tokenviz.ui.selection import Selection

Fetched = Inspect | Attribute | SplitDifference
Wanted = tuple[Fetched, Hashable] | None  # the request, and what must change before it is sent again


@dataclass(frozen=True)
class ViewFetch:
    """One view's fetch policy: `wanted(selection, method)` is the request the view needs now, or None."""

    kind: type[Request[Any]]  # the request's kind: a cancelled one leaves the view open, its key runs it again
    wanted: Callable[[Selection, AttributionMethod], Wanted]


def _inspection(selection: Selection, method: AttributionMethod) -> Wanted:
    s = selection.snapshot
    if s.playing or not s.live or current_inspection(selection) is not None:
        return None
    return Inspect(position=selection.cursor), (s.seq, selection.cursor)


def _attribution(selection: Selection, method: AttributionMethod) -> Wanted:
    """The token after the cursor, by the chosen method (a recording answers with what its file kept)."""
    if selection.snapshot.playing or selection.following_id is None:
        return None
    shown = current_attribution(selection)
    request = Attribute(position=selection.cursor, method=method)
    if shown is not None and shown.method == method:
        return None
    return request, request


def _difference(selection: Selection, method: AttributionMethod) -> Wanted:
    """The logit difference of the two tokens watched last after the cursor, split by layer."""
    s = selection.snapshot
    if s.playing or len(s.pinned) < 2 or current_difference(selection) is not None:
        return None
    if lacking(selection.info, Capability.LOGIT_SPLIT, "the logit split") is not None:
        return None  # (the watch view says so: a served model's layers are the server's)
    request = SplitDifference(position=selection.cursor)
    return request, (request, s.pinned[-2:])


VIEW_FETCHES: dict[str, ViewFetch] = {  # by the view's widget id
    "lens": ViewFetch(Inspect, _inspection),
    "embedding": ViewFetch(Inspect, _inspection),
    "attribution": ViewFetch(Attribute, _attribution),
    "watch": ViewFetch(SplitDifference, _difference),
}
