"""A long job's estimate of its time left (issue 69, finding 21): a beam search said "about 45 s left"
at its first step (which also copied the cache) and, 45 s later, "step 8 of 10 · about 12 s left"."""

import pytest

from tokenviz.worker.step_times import time_left


def test_the_estimate_follows_the_pace_after_the_first_unit():
    marks = [(0, 0.0), (1, 5.0)]  # the first step: 5 s (the set-up's included)
    assert time_left(marks, 10) == pytest.approx(45.0)  # (all it knows yet)
    for step in range(2, 9):  # then 1 s a step
        marks.append((step, 5.0 + (step - 1)))
        del marks[2:-1]
    assert time_left(marks, 10) == pytest.approx(2.0)  # (was 12: the first step's set-up spread over all)
    assert time_left([(0, 0.0)], 10) is None
