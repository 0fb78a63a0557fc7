"""What the views show that the worker computes, kept between frames: the newest result of each kind of
request, which kind's last run was cancelled or refused (and why), and the standing views (the attention
rows the pane shows, the lens at the newest position), computed after the command that changed them so a
frame only reads them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenviz.contract.attention import AttentionView
from tokenviz.contract.commands import Beams, Inspect, Request, ShowAttention, ShowLens, Speculate, Verify
from tokenviz.contract.engine import Capability, IsCancelled
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.features import WatchedFeature
from tokenviz.contract.results import ViewResult
from tokenviz.worker.attention_rows import AttentionRows

if TYPE_CHECKING:
    from tokenviz.journey.session import Session

RUNS = (Beams, Speculate, Verify)  # searches from the journey as it is: a new run replaces the old one
Compute = Callable[[Request[Any], "Session"], ViewResult]  # a view's result, its progress shown
Saying = Callable[..., AbstractContextManager[object]]  # (what, view=): a wait said while it lasts (Meanwhile)


def _silently(what: str, view: str = "") -> AbstractContextManager[object]:
    return contextlib.nullcontext()


class ViewResults:
    def __init__(self, compute: Compute) -> None:
        self._compute = compute
        self.results: dict[type[Request[Any]], ViewResult] = {}  # the newest result of each kind of request
        self.cancelled: set[type[Request[Any]]] = set()  # whose last run was cancelled
        self.failed: dict[type[Request[Any]], str] = {}  # whose last run was refused, and why
        self._attention_request: ShowAttention | None = None
        self._lens_request: ShowLens | None = None
        self._attention_failed: tuple[tuple[int, range, tuple[int, ...]], AttentionView] | None = None
        self._attention_rows = AttentionRows()
        self.attention: AttentionView | None = None  # the rows the attention pane shows, as of the last command
        self.due = False  # a command changed what the standing views show: `after` has work to do
        self.paged = False  # the attention rows' window was paged (autoplay's) when `after` last ran
        self.took: dict[str, float] = {}  # ms each standing view's work took in the last `after`
        self.followed: tuple[WatchedFeature, ...] = ()  # the watched features' activations, each step's

    def run(self, request: Request[Any], session: Session) -> None:
        """Compute a view's result. A search's (beams, speculation, verify) is of the journey as it
        is now: the old one goes when a new one starts. A cancelled or refused one is marked so its view
        says so."""
        kind = type(request)
        self.cancelled.discard(kind)
        self.failed.pop(kind, None)
        if kind in RUNS:
            self.results.pop(kind, None)
        try:
            self.results[kind] = self._compute(request, session)
        except Cancelled:
            self.cancelled.add(kind)
            raise
        except TokenvizError as exc:  # its view says why, not "computing…"
            self.failed[kind] = str(exc)
            raise

    def forget(self) -> None:
        """A new journey: every view's result, cancellation and refusal was the old one's."""
        self.results.clear()
        self.cancelled.clear()
        self.failed.clear()

    def stand(self, request: ShowAttention | ShowLens) -> None:
        """A view's standing request: each frame (ShowAttention) or each step's (ShowLens) carries its rows."""
        if isinstance(request, ShowAttention):
            self._attention_request = request if request.rows > 0 else None
        else:
            self._lens_request = request if request.rows != () else None

    def after(
        self, session: Session, saying: Saying = _silently, paged: bool = False, give_way: IsCancelled = None
    ) -> None:
        """The standing views of the journey as the commands left it: the model's work is here, a frame
        reads. `saying` says a wait of each view's pass while it lasts; `took` times them. `paged`: the
        attention rows' window moves by half-windows (while autoplay runs: contract.attention.window).
        `give_way()` True (a key waits) sets the attention rows' pass aside: no rows, and still `due`."""
        self.due, self.took, self.paged = False, {}, paged
        try:
            self.followed = ()
            if session.watched_features and session.records:
                from tokenviz.journey.feature_readings import follow_features  # deferred: it imports torch

                with self._timed("watched features"), contextlib.suppress(TokenvizError):
                    self.followed = follow_features(session)
            if self._lens_request is not None and session.records:
                newest = f"computing the logit lens at position {len(session.ids) - 1}"
                with self._timed("lens"), saying(newest, view="lens"):
                    self._standing_lens(session)
            if self._attention_request is None or not session.records:
                self.attention = None
                return
            with self._timed("attention map"), saying(self._attention_pass(session), view="attention"):
                self.attention = self._attention_view(session, give_way)
        except Cancelled:  # the key first; the rows once it is done (the pane keeps its last map)
            self.attention, self.due = None, True

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        """`took[name]`: the ms of the work inside (none where it was set aside)."""
        started = time.perf_counter()
        yield
        self.took[name] = (time.perf_counter() - started) * 1e3

    def _attention_pass(self, session: Session) -> str:
        """What the wait for the attention rows' pass is, in the status line's words."""
        assert self._attention_request is not None
        layers = session.engine.info.layers
        layer, queries = self._attention_request.resolve(session.engine.kv_len, layers, self.paged)
        return f"computing the attention map: layer {layer}, positions {queries.start}–{queries.stop - 1}"

    def fields(self, busy: bool) -> dict[str, Any]:
        """What a frame says of the views' results (no attention rows while a job runs)."""
        return dict(
            results=tuple(self.results.values()),
            cancelled=tuple(kind.__name__ for kind in self.cancelled),
            failed=tuple((kind.__name__, line) for kind, line in self.failed.items()),
            attention=None if busy else self.attention,
            watched_features=self.followed,
        )

    def _standing_lens(self, session: Session) -> None:
        """The lens the open view shows at the newest position while it stands (ShowLens): read in the
        step's own pass where the engine can (and kept: asked again, it is no work), so the frame after a
        step carries it, during autoplay too. Its refusal is its view's to say."""
        request = self._lens_request
        newest = len(session.ids) - 1  # the view's cursor where it follows the journey
        if request is None or not session.records or newest < 0:
            return
        with contextlib.suppress(TokenvizError):  # marked failed: the lens view says why
            self.run(Inspect(newest, request.rows), session)

    def _attention_view(self, session: Session, give_way: IsCancelled) -> AttentionView | None:
        """The rows the attention pane asked for, computed for the journey as it is now."""
        request = self._attention_request
        if request is None or not session.records:
            return None
        if Capability.ATTENTION.value not in session.engine.info.capabilities:
            return None  # the attention pane says why: the engine does not give it
        layer, queries = request.resolve(session.engine.kv_len, session.engine.info.layers, self.paged)
        asked = (layer, queries, tuple(session.ids))
        if self._attention_failed is not None and self._attention_failed[0] == asked:
            return self._attention_failed[1]  # asked once: not again each frame
        try:
            return self._attention_rows.view(session, layer, queries, give_way)
        except Cancelled:  # set aside for a key: asked again after it (see after)
            raise
        except TokenvizError as exc:  # a server's rows it cannot give: the pane says why, not "computing…"
            weights = np.full((session.engine.info.heads, len(queries), queries.stop), np.nan, dtype=np.float32)
            failed = AttentionView(layer=layer, queries=queries, weights=weights, missing=str(exc), failed=True)
            self._attention_failed = (asked, failed)
            return failed
