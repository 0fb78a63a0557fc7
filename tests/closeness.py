"""Two paths' results compared as numbers are: floats within a stated tolerance, everything else equal.

Two computations of the same thing in float32 may differ in the last bit where they take different
kernels: a position's row computed in a batch of rows and alone, on CPUs whose matrix kernels sum in a
different order by the number of rows (seen on a user's machine: -13.595766067504883 against
-13.595765113830566, one float32 rounding apart). Ids, texts and counts must still be equal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

ONE_ROUNDING = 1e-5  # relative: the truth tests' bound between the cache and a full recompute
NEAR_ZERO = 1e-6  # absolute, for numbers near 0 (a few roundings of a number near 1)


def assert_close(got: Any, expected: Any, rel: float = ONE_ROUNDING, abs_: float = NEAR_ZERO, where: str = "") -> None:
    """`got` equals `expected` but for floats, each within `rel` (relative) or `abs_` (near zero)."""
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(expected, float) and math.isnan(expected):
            assert isinstance(got, float) and math.isnan(got), where
            return
        assert got == pytest.approx(expected, rel=rel, abs=abs_), where
    elif dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(got) is type(expected), where
        for field in dataclasses.fields(expected):
            name = field.name
            assert_close(getattr(got, name), getattr(expected, name), rel, abs_, f"{where}.{name}")
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_close(got[key], expected[key], rel, abs_, f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_close(a, b, rel, abs_, f"{where}[{i}]")
    else:
        assert got == expected, where
