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


RESIZES = [(80, 24), (200, 60), (80, 24), (120, 36)]  # a teacher plugging into a projector, and back


@pytest.mark.parametrize("after", range(1, len(RESIZES) + 1), ids=lambda n: "x".join(map(str, RESIZES[n - 1])))
def test_a_sequence_of_resizes(snap_compare, after):
    async def resize(pilot):
        while pilot.app.journey.snapshot_drawn is None:  # the first frame, as a person sees it, then resize
            await pilot.pause(0.05)
        for width, height in RESIZES[1:after]:
            await pilot.resize_terminal(width, height)
            await pilot.pause(0.2)

    assert snap_compare(recorded_app(SNAPSHOT), terminal_size=RESIZES[0], run_before=resize)


def test_a_2000_token_prompt_at_80x24(snap_compare):
    prompt = "the quick brown fox jumps over a lazy dog. " * 56  # 2,130 tokens of the tiny tokenizer
    recording = frozen_recording(steps=3, prompt=prompt, context=4096)
    assert recording.snapshot.prompt_len >= 2000
    assert snap_compare(recorded_app(recording), terminal_size=(80, 24))
