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
