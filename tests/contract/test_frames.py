"""Snapshots are plain data, and a journey's frames carry what changed: every snapshot and every frame
pickles with nothing but contract types (and numpy's arrays and Python's own), a frame's size does
not grow with the journey's length, and the reader puts back exactly the snapshot that was sent,
through steps, rewinds, branch switches, watched tokens filled in and interventions."""

import io
import pickle

from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.frames import Frame, FrameReader, FrameWriter
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


def test_frames_carry_the_change_and_rebuild_the_snapshot_exactly():
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, max_new_tokens=80))
    writer, reader = FrameWriter(), FrameReader()
    sizes = {}

    def send() -> None:
        snapshot = snapshot_of(session)
        frame, modules = crossed(writer.frame(snapshot))
        assert isinstance(frame, Frame) and all(m.startswith(ALLOWED) for m in modules), modules
        whole, modules = crossed(snapshot)
        assert all(m.startswith(ALLOWED) for m in modules), modules
        assert reader.read(frame) == snapshot == whole
        sizes[len(session.records)] = (len(pickle.dumps(frame)), len(pickle.dumps(snapshot)))

    session.start(PROMPT)
    send()
    for _ in range(40):
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
    (frame_6, whole_6), (frame_40, whole_40) = sizes[6], sizes[40]
    assert frame_40 < 1.3 * frame_6 + 500  # flat in the journey's length (a step's record, the text's tail)
    assert whole_40 > 3 * whole_6  # where the whole snapshot grows with it


def test_a_lost_frame_is_an_error_not_a_wrong_journey():
    import pytest

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0))
    session.start(PROMPT)
    writer, reader = FrameWriter(), FrameReader()
    writer.frame(snapshot_of(session))  # never read
    session.step()
    with pytest.raises(ValueError, match="a frame was lost"):
        reader.read(writer.frame(snapshot_of(session)))
