"""Chips laid out in lines, kept between frames: the incremental layout always equals a fresh one,
and a journey that grows by a token measures only the new chip."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.render.chip_lines import ChipLines


def fresh(widths: list[int], width: int) -> list[int]:
    lines = ChipLines(lambda i: widths[i])
    lines.update(list(range(len(widths))), width)
    return lines.starts


def expected_starts(widths: list[int], width: int) -> list[int]:
    starts, used = [], width
    for i, w in enumerate(widths):
        if used + w > width and (used > 0 or not starts):
            starts.append(i)
            used = 0
        used += w
    return starts


edits = st.lists(
    st.tuples(st.sampled_from(["append", "cut", "replace", "width"]), st.integers(1, 12), st.integers(0, 40)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(edits=edits)
def test_the_kept_layout_equals_a_fresh_one_after_any_edits(edits):
    keys: list[int] = []
    widths: dict[int, int] = {}
    next_key = [0]
    width = 20
    lines = ChipLines(lambda i: widths[keys[i]])

    def new_chip(w):
        next_key[0] += 1
        widths[next_key[0]] = w
        return next_key[0]

    for op, w, n in edits:
        if op == "append":
            keys.append(new_chip(w))
        elif op == "cut":
            del keys[n % (len(keys) + 1) :]
        elif op == "replace" and keys:
            keys[n % len(keys)] = new_chip(w)
        elif op == "width":
            width = 5 + n
        lines.update(keys, width)
        assert lines.starts == expected_starts([widths[k] for k in keys], width)
        assert all(lines.line_of(i) == max(j for j, s in enumerate(lines.starts) if s <= i) for i in range(len(keys)))


def test_a_growing_journey_measures_only_its_new_chips():
    measured = []
    lines = ChipLines(lambda i: (measured.append(i), 7)[1])
    keys = list(range(6000))
    lines.update(keys, 80)
    measured.clear()
    lines.update([*keys, 6000], 80)
    assert max(measured) == 6000 and len(measured) <= 80 // 7 + 1  # the last line only


def test_a_new_look_lays_out_everything_again():
    wide = {"on": False}
    lines = ChipLines(lambda i: 6 if wide["on"] else 3)
    keys = list(range(10))
    lines.update(keys, 12, look="ids hidden")
    assert lines.starts == [0, 4, 8]
    wide["on"] = True  # the ids shown: every chip is wider, though no key changed
    lines.update(keys, 12, look="ids shown")
    assert lines.starts == fresh([6] * 10, 12) == [0, 2, 4, 6, 8]
