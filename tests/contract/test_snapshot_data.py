"""Snapshots are plain data: every snapshot pickles with nothing but contract types (and numpy's arrays
and Python's own) and comes back equal, through steps, rewinds, branch switches, watched tokens filled
in and interventions; and a step's snapshot is built once on its way to the screen."""

import io
import pickle

from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.interventions import HeadAblation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.worker.snapshots import snapshot_of

PROMPT = "The cat sat on the mat. The dog"
ALLOWED = ("tokenviz.contract.", "builtins", "copyreg", "_codecs", "numpy", "collections")


class Classes(pickle.Unpickler):
    """Unpickles, noting every class the data names."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.named: set[str] = set()

    def find_class(self, module, name):
        self.named.add(module)
        return super().find_class(module, name)


def crossed(value):
    """`value` as it comes out of a pipe, and the modules its classes come from."""
    reader = Classes(pickle.dumps(value))
    return reader.load(), reader.named


def test_a_snapshot_pickles_with_contract_types_alone_and_comes_back_equal():
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, max_new_tokens=80))

    def send() -> None:
        snapshot = snapshot_of(session)
        whole, modules = crossed(snapshot)
        assert all(m.startswith(ALLOWED) for m in modules), modules
        assert whole == snapshot

    session.start(PROMPT)
    send()
    for _ in range(10):
        session.step()
        send()
    session.rewind(3)
    send()
    session.step(forced_id=7)  # a branch: the old path is kept
    send()
    session.switch_branch(0)
    send()
    session.pin([5, 9])  # every step's watched values filled in: every record a new object
    send()
    session.set_interventions([HeadAblation(0, 1)])
    send()
    session.step()
    send()


async def test_a_steps_snapshot_is_built_once_on_its_way_to_the_screen(monkeypatch):
    """The worker builds a frame's snapshot once, with its own fields, and the screen is handed it
    whole: no copy is made of it on the way (before: four, the journey's, the worker's, a frame's
    cut and the screen's rebuild)."""
    from apptools import make_app, settle, wait_for

    from tokenviz.contract.snapshot import Snapshot

    built = []
    init = Snapshot.__init__

    def counted(self, *args, **kwargs):
        built.append(kwargs.get("seq"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(Snapshot, "__init__", counted)
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        screen = app.journey
        seen = screen.snapshot
        built.clear()
        await pilot.press("space")
        await wait_for(lambda: screen.snapshot is not seen and screen.snapshot.state == "ready", pilot)
        shown = screen.snapshot
    frames = sorted(set(built))
    assert frames and len(built) == len(frames), built  # each frame's snapshot made once, none copied
    assert shown.seq in frames  # (the one on screen is one the worker built, not a copy)
