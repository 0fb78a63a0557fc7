"""Pure rendering on plain arrays: heatmaps, bars, colour ramps, pieces, attention windows."""

import itertools

import numpy as np
import pytest
from apptools import frozen_recording

from tokenviz.contract.attention import SavedAttention, head_label, window
from tokenviz.render.bars import bar
from tokenviz.render.colors import parse_hex, ramp
from tokenviz.render.heatmap import UPPER_HALF, legend, pair_codes, quantise, run_segments
from tokenviz.render.visible import visible


def test_bars_use_eighth_blocks():
    assert bar(0.0, 4) == "    "
    assert bar(1.0, 4) == "████"
    assert bar(0.5, 4) == "██  "
    assert bar(1 / 32, 4) == "▏   "  # one eighth of one cell
    assert bar(0.3, 4) == "█▎  "  # 9.6 eighths -> 10: one full cell and two eighths
    assert bar(2.0, 3) == "███" and bar(-1, 3) == "   "
    assert all(len(bar(x / 100, 7)) == 7 for x in range(101))


def test_ramp_interpolates_between_stops():
    colors = ramp(["#000000", "#ffffff"], 3)
    assert colors == ["#000000", "#808080", "#ffffff"]
    assert parse_hex("#abc") == (0xAA, 0xBB, 0xCC)
    three = ramp(["#ff0000", "#00ff00", "#0000ff"], 5)
    assert three[0] == "#ff0000" and three[2] == "#00ff00" and three[4] == "#0000ff"


def test_heatmap_packs_two_rows_per_line_with_half_blocks():
    m = np.array([[0.0, 1.0], [1.0, np.nan], [0.25, 0.0]])
    colors = ["#000000", "#555555", "#aaaaaa", "#ffffff"]
    lines = [run_segments(row, colors, "#123456") for row in pair_codes(m, len(colors), gamma=1.0)]
    assert len(lines) == 2  # three rows -> two terminal lines
    first = lines[0]
    assert "".join(s.text for s in first) == UPPER_HALF * 2
    assert str(first[0].style.color.triplet.hex) == "#000000" and str(first[0].style.bgcolor.triplet.hex) == "#ffffff"
    assert str(first[1].style.color.triplet.hex) == "#ffffff" and str(first[1].style.bgcolor.triplet.hex) == "#123456"
    second = lines[1]  # the padding row below is masked
    assert str(second[0].style.bgcolor.triplet.hex) == "#123456"
    assert quantise(np.array([[np.nan, 0.0, 1.0]]), 4, gamma=1.0).tolist() == [[-1, 0, 3]]


def test_heatmap_merges_equal_neighbours():
    m = np.zeros((2, 50))
    lines = [run_segments(row, ["#000000", "#ffffff"], "#000000") for row in pair_codes(m, 2)]
    assert len(lines[0]) == 1 and lines[0][0].text == UPPER_HALF * 50


def test_legend_spans_the_scale():
    segments = legend(["#000000", "#ffffff"], 10, gamma=1.0)
    assert len(segments) == 10
    assert str(segments[0].style.bgcolor.triplet.hex) == "#000000"
    assert str(segments[-1].style.bgcolor.triplet.hex) == "#ffffff"


@pytest.mark.parametrize(
    "text, shown",
    [
        (" the", "·the"),
        ("\n", "↵"),
        ("\t", "⇥"),
        ("a\r\n", "a␍↵"),
        ("", "∅"),
        ("\x00", "<0x00>"),
        ("é", "é"),
    ],
)
def test_pieces_are_made_visible(text, shown):
    assert visible(text) == shown


def test_window_holds_the_cursor():
    assert window(0, 100, 10) == range(0, 10)
    assert window(50, 100, 10) == range(45, 55)
    assert window(98, 100, 10) == range(90, 100)  # away from the newest: as full as it can be
    assert window(3, 5, 10) == range(0, 5)


def test_a_window_following_the_newest_position_moves_by_half_windows():
    starts = []
    for length in range(11, 60):
        shown = window(length - 1, length, 10)
        assert length - 1 in shown and len(shown) <= 10 and shown.stop == length
        starts.append(shown.start)
    jumps = [b - a for a, b in itertools.pairwise(starts) if b != a]
    assert jumps and set(jumps) == {5}  # the rows on screen stay put between jumps
    assert window(99, 100, 10) == range(90, 100)


def test_at_rest_a_window_following_the_newest_position_is_full():
    """UX 7's finding 20: between two jumps a paged window showed the newest rows above blank ones; at rest
    (not autoplay) the window ending at the newest position is as full as it can be."""
    for length in range(1, 60):
        shown = window(length - 1, length, 10, paged=False)
        assert shown == range(max(length - 10, 0), length), (length, shown)


def test_a_saved_journeys_attention_is_every_layers_rows_and_views_mask_the_future():
    snapshot, attention, _ = frozen_recording(steps=3)
    n = snapshot.prompt_len
    positions = n + len(snapshot.records) - 1
    assert sorted(attention.rows) == list(range(positions))  # a short journey keeps every row
    for layer in range(snapshot.info.layers):
        view = attention.view(layer, range(positions), snapshot.info.heads)
        assert np.allclose(view.row(2, 1), attention.rows[2][layer, 1, :3].astype(np.float32))
        expected = attention.rows[n + 1][layer, :, : n + 2].astype(np.float32).mean(0)
        assert np.allclose(view.row(n + 1, "mean"), expected)
        assert view.row(n + 1, "mean").sum() == pytest.approx(1.0, abs=1e-2)
        assert np.allclose(view.row(4, "max"), attention.rows[4][layer, :, :5].astype(np.float32).max(0))
    view = attention.view(0, range(positions), snapshot.info.heads)
    matrix = view.window(range(0, n + 2), range(0, n + 2), "mean")
    assert matrix.shape == (n + 2, n + 2)
    assert np.isnan(matrix[0, 1]) and not np.isnan(matrix[n + 1, n + 1])  # causal: the future is masked
    assert np.allclose(np.nansum(matrix, 1), 1.0, atol=1e-2)
    assert not view.missing
    partial = SavedAttention({p: r for p, r in attention.rows.items() if p >= n})
    assert partial.view(0, range(positions), snapshot.info.heads).missing.startswith(f"rows 0-{n - 1} were not saved")


def test_head_labels_name_the_kv_group():
    assert head_label("mean", 9, 3) == "head mean of 9"
    assert head_label(0, 9, 3) == "head 0 of 9 (kv group 0 of 3)"  # (from 0, as layers, positions and --ablate)
    assert head_label(4, 9, 3) == "head 4 of 9 (kv group 1 of 3)"
    assert head_label(8, 9, 3) == "head 8 of 9 (kv group 2 of 3)"
    assert head_label(2, 4, 4) == head_label(2, 4, 1) == "head 2 of 4"  # no groups: one head each, or one for all


def test_a_probability_never_reads_zero_unless_it_is():
    from tokenviz.render.units import probability

    assert probability(0.4831) == "0.483" and probability(0.0005) == "0.001"
    assert probability(2.78e-5) == "2.8e-05" and probability(0.0) == "0"
    assert probability(1e-30, 8) == " 1.0e-30"


def test_byte_pieces_spell_their_character_at_the_last_one():
    from tokenviz.render.visible import piece_bytes, spelled

    pieces = ["The", "<0xE2>", "<0x82>", "<0xAC>", "5", "<0xF0><0x9F>", "<0x98><0x80>", "<0x0D>", "<0xE2>"]
    assert piece_bytes("<0xE2><0x82>") == b"\xe2\x82" and piece_bytes("Tower") is None
    assert [spelled(pieces, i) for i in range(len(pieces))] == ["", "", "", "€", "", "", "😀", "", ""]


def test_a_log_sparkline_puts_every_series_on_one_scale():
    from tokenviz.render.sparkline import SPARK, log_sparkline

    london, paris = log_sparkline([5.1e-05], 1), log_sparkline([0.318], 1)
    assert SPARK.index(london) < SPARK.index(paris)  # each scaled on its own, both would be full blocks
    assert log_sparkline([1.0, 1e-6, 1e-9, 0.0], 4) == "█▁▁ "  # the floor and below: the lowest; 0: none


def test_a_time_taken_reads_in_the_unit_a_person_reads_it_in():
    from tokenviz.render.units import elapsed

    assert elapsed(12.34) == "12.3 ms" and elapsed(4200) == "4.2 s"
    assert elapsed(230692.6) == "3 min 51 s"  # not "230692.6 ms"


def test_a_line_of_prose_is_cut_where_a_phrase_ends_else_at_a_word():
    from tokenviz.render.columns import phrase_cut

    text = "converting it once; a tensor at a time, later starts read the cache"
    assert phrase_cut(text, 200) == text
    assert phrase_cut(text, 30) == "converting it once…"  # (the last phrase end that leaves room for "…")
    assert phrase_cut(text, 50) == "converting it once; a tensor at a time…"
    assert phrase_cut("one two three four", 10) == "one two…"  # (no phrase end: a word's)
    assert phrase_cut("abcdefghijkl", 5) == "abcd…"  # (no space: mid-word, as cell cuts)
