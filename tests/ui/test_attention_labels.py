"""The attention matrix labels its rows with their tokens and its columns with theirs."""

from tokenviz.contract.records import TokenChip
from tokenviz.ui.panes.attention import LABEL, key_axis, row_label

CHIPS = [TokenChip(i, text, i < 3, False) for i, text in enumerate(["The", " Eiffel", " Tower", " is", "\n"])]


def test_a_row_label_names_the_position_and_the_tokens_of_its_two_rows():
    label = row_label([1, 2], CHIPS, cursor=False)
    assert label == "    1 ·Eiffe… " and len(label) == LABEL  # shortened to fit, and says so
    assert row_label([3, 4], CHIPS, cursor=False) == "    3 ·is/↵   "
    assert row_label([3], CHIPS, cursor=True).startswith("▶   3 ·is")
    assert row_label([], CHIPS, cursor=False) == " " * LABEL  # a zoomed row already labelled


def test_each_key_column_shows_its_tokens_first_letters():
    assert key_axis(range(5), CHIPS, 1) == "TETi↵"
    assert key_axis(range(1, 3), CHIPS, 3) == "EifTow"


async def test_the_marked_row_names_the_cursors_position_when_it_shares_a_terminal_row():
    """Issue 51, item 11: two query rows share a terminal row; with the cursor on the second, the mark
    said the first's position (59 with the cursor at 60). It says the cursor's."""
    from apptools import make_app, settle

    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.panes.attention import AttentionPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60), context=256)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        for _ in range(30):
            await pilot.press("space")
        await settle(app, pilot)
        for _ in range(3):  # the cursor on each row of a pair, in turn
            await pilot.press("left")
            await settle(app, pilot)
            await pilot.pause(0.3)
            cursor = app.journey.cursor
            marked = [strip.text for strip in app.query_one(AttentionPane)._strips if strip.text.startswith("▶")]
            assert len(marked) == 1 and marked[0][1:5].strip() == str(cursor), (marked, cursor)


async def test_the_room_left_below_the_newest_row_says_the_next_rows_come_there():
    """Issue 69, finding 16: following the newest token at 120x36, the map left rows empty under it
    ("queries 12–18 of 19"), which read as a fault. While autoplay runs the rows stay put as the journey
    grows (a step draws only its own row); the room under them says what fills it. (At rest the map is
    full: the next test.)"""
    from apptools import make_app, settle, text_of, wait_for

    from tokenviz.contract.settings import SamplingSettings

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60), context=256)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        pane = app.query_one("#attention")
        seen = {"room": 0, "full": 0}
        await pilot.press("minus", "minus", "minus", "a")  # a step every 0.5 s: each frame is read
        for _ in range(14):
            steps = len(app.journey.snapshot.chips)
            # (the frame of the new step drawn: its pane's lines are on screen)
            await wait_for(lambda steps=steps: len(app.journey.snapshot_drawn.chips) > steps, pilot)
            s = app.journey.snapshot_drawn
            lines = text_of(pane).splitlines()
            if not s.playing or not any(line.startswith("▶") for line in lines):
                continue
            newest = next(i for i, line in enumerate(lines) if line.startswith("▶"))
            if "↓ the next tokens' rows come here" in lines[newest + 1]:
                seen["room"] += 1
            elif "↓" not in "".join(lines):  # a full map: the key axis right under the newest row
                seen["full"] += 1
        await pilot.press("a")
        assert seen["room"] and seen["full"], seen


async def test_at_120x36_the_map_at_rest_has_no_blank_rows_under_the_newest():
    """UX 7's finding 20: at 120x36, stepping with space, the map showed a few query rows above blank rows (the
    window had just moved on by half its size, as autoplay's does). At rest the map is full, the newest row
    last; while autoplay runs it pages, so a step draws only its newest row."""
    from apptools import make_app, settle

    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.panes.attention import COMING, AttentionPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60), prompt="The Eiffel Tower is")
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        for _ in range(8):
            await pilot.press("space")
            s = await settle(app, pilot)
            pane = app.query_one(AttentionPane)
            lines = [pane.render_line(y).text for y in range(pane.size.height)]
            assert not any(COMING[1] in line or COMING[0] in line for line in lines), lines
            newest = len(s.chips) - 1
            assert f"▶{newest:>4}" in lines[pane.rows_shown() // 2 - 1], lines
