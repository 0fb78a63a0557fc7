"""Every view is computed one way (tokenviz.journey.views): `trace`'s entry for a step equals what the
app's engine worker answers for the same journey at the same position, view by view."""

import threading
import time

from closeness import assert_close
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.cli.headless import add_views, beam_document, journey_document, run_session
from tokenviz.contract.commands import Attribute, Beams, Inspect, SplitDifference, Step, Watch
from tokenviz.contract.results import Attribution, Inspection, LogitDifference
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.record_json import attribution_json, beams_json, lens_row_json, logit_difference_json
from tokenviz.journey.session import Session
from tokenviz.journey.views import VIEWS, compute
from tokenviz.worker.engine_thread import EngineWorker

PROMPT = "The cat sat on the mat. The dog"
SETTINGS = SamplingSettings(temperature=0, max_new_tokens=3)


class Latest:
    """The worker's newest snapshot, waited for."""

    def __init__(self):
        self.snapshot = None
        self.arrived = threading.Condition()

    def __call__(self, snapshot):
        with self.arrived:
            self.snapshot = snapshot
            self.arrived.notify_all()

    def wait(self, predicate, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        with self.arrived:
            while self.snapshot is None or not predicate(self.snapshot):
                left = deadline - time.monotonic()
                assert left > 0, f"no such snapshot; the last: {self.snapshot}"
                self.arrived.wait(left)
            return self.snapshot


def result_of(snapshot, kind):
    return next((r for r in snapshot.results if isinstance(r, kind)), None)


def test_the_trace_and_the_app_compute_each_view_the_same_way():
    session = Session(ModelRunner(tiny_model("llama")), SETTINGS)
    session.pin([5, 9])
    run_session(session, PROMPT)
    document = journey_document(session)
    add_views(session, document, True, False, True, "loo", lambda message, fraction: None)
    steps = document["steps"]
    first = len(session.prompt_ids) - 1

    latest = Latest()
    worker = EngineWorker(lambda progress: ModelRunner(tiny_model("llama")), SETTINGS, PROMPT)
    worker.start(latest)
    try:
        latest.wait(lambda s: s.state == "ready" and s.records)
        for token in (5, 9):
            worker.submit(Watch(token))
        for _ in steps[1:]:
            worker.submit(Step())
        handled = worker.submitted
        s = latest.wait(lambda s: s.handled >= handled)
        assert [c.id for c in s.chips] == session.ids[: len(s.chips)]
        texts, ids = [c.text for c in s.chips], [c.id for c in s.chips]
        for i, step in enumerate(steps):
            position = first + i
            for request, kind, entry in (
                (Inspect(position), Inspection, lambda r: {"lens": [lens_row_json(row) for row in r.lens]}),
                (Attribute(position, "loo"), Attribution, lambda r: {"attribution": attribution_json(r, texts, ids)}),
                (SplitDifference(position), LogitDifference, lambda r: {"logit_difference": logit_difference_json(r)}),
            ):
                worker.submit(request)
                answer = latest.wait(lambda s, handled=worker.submitted: s.handled >= handled)
                result = result_of(answer, kind)
                assert result is not None, request
                for key, value in entry(result).items():
                    assert_close(step[key], value, where=f"{request} {key}")
    finally:
        worker.stop()


def test_the_traces_beam_search_is_the_apps_from_the_prefilled_prompt():
    session = Session(ModelRunner(tiny_model("llama")), SETTINGS)
    session.start(PROMPT)
    document = beam_document(session, session.prompt_ids, 2, 3)
    app = Session(ModelRunner(tiny_model("llama")), SETTINGS)
    app.start(PROMPT)
    assert_close(document["beams"], beams_json(compute(app, Beams(2, 3))))
    assert all(spec.trace is not None for kind, spec in VIEWS.items() if kind in (Inspect, Attribute, SplitDifference))
