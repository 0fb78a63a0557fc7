"""Screenshots of the main screen, compared with pytest-textual-snapshot.

Driven by a recorded snapshot of a tiny model's journey with the timings zeroed, so every pixel is
deterministic. Update with `pytest tests/test_snapshots.py --snapshot-update` after a deliberate change.
"""

import pytest
from apptools import frozen_recording, recorded_app

SNAPSHOT = frozen_recording(steps=4)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen(snap_compare, size):
    assert snap_compare(recorded_app(SNAPSHOT), terminal_size=size)


@pytest.mark.parametrize("theme", ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"])
def test_each_theme(snap_compare, theme):
    assert snap_compare(recorded_app(SNAPSHOT, theme), terminal_size=(120, 36))


def test_a_moved_cursor_and_another_head(snap_compare):
    assert snap_compare(recorded_app(SNAPSHOT), terminal_size=(120, 36), press=["left", "left", "h", "h", "h"])
