"""The journey reader against damaged and hostile files: property-based mutations of a valid
journey either load into a journey the panes can draw, with every string printable, or fail with
one clear line naming the field; nothing else ever escapes."""

import base64
import copy
import dataclasses
import json

import numpy as np
import pytest
from apptools import frozen_recording
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import is_printable
from tokenviz.files.journey_file import journey_file, read_journey, recording_of, snapshot_from_journey

VALID = json.loads(json.dumps(journey_file(*frozen_recording(steps=3))))
HOSTILE = ["\x1b]0;PWNED\x07\x1b[2J", "\x9b31m", "[/]", "[bold]x", "\u2028", "", "x" * 300]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(HOSTILE)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)


def paths(node, prefix=()):
    """Every place in the document a mutation can hit."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "float16":  # a large blob: its own mutations below
                yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:6]):
            yield from paths(value, (*prefix, i))


PATHS = [p for p in paths(VALID) if p]


def mutate(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def strings_of(value):
    if isinstance(value, str):
        yield value
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from strings_of(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from strings_of(item)


def check(doc) -> None:
    """The property: a clear one-line error, or a journey every pane can draw safely."""
    try:
        snapshot, attention, _ = recording_of(doc)
    except TokenvizError as exc:
        assert "\n" not in str(exc) and is_printable(str(exc))
        return
    assert all(is_printable(s) for s in strings_of(snapshot))
    n = snapshot.prompt_len + len(snapshot.records) - 1
    for layer in range(snapshot.info.layers):
        view = attention.view(layer, range(n), snapshot.info.heads)
        for query in range(n):
            assert view.row(query, "mean").shape == (query + 1,)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=json_values)
@example(path=("replay", "records", 0, "decision", "settings", "stop"), value=None)  # (a TypeError, once)
def test_a_mutated_journey_loads_safely_or_fails_in_one_line(path, value):
    check(mutate(copy.deepcopy(VALID), path, value))


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(PATHS))
def test_a_journey_missing_any_field_fails_in_one_line(path):
    doc = copy.deepcopy(VALID)
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    check(doc)


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, len(json.dumps(VALID)) - 1))
def test_a_truncated_file_fails_in_one_line(tmp_path_factory, cut):
    path = tmp_path_factory.mktemp("cut") / "j.json"
    path.write_text(json.dumps(VALID)[:cut])
    with pytest.raises(TokenvizError):
        read_journey(path)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(-2, 40), min_size=0, max_size=5), record=st.integers(0, 3))
def test_attention_of_any_shape_is_checked_before_use(shape, record):
    doc = copy.deepcopy(VALID)
    values = int(np.prod([max(d, 0) for d in shape])) if shape else 0
    blob = base64.b64encode(
        np.full(values, 0.5, dtype=np.float16).tobytes()
    ).decode()  # as many values as the shape says
    doc["replay"]["records"][record]["attention"] = {"shape": shape, "float16": blob}
    check(doc)


def test_an_escape_sequence_in_a_journey_never_reaches_the_screen():
    doc = mutate(copy.deepcopy(VALID), ("replay", "info", "name"), "\x1b]0;PWNED-TITLE\x07\x1b[2J")
    snapshot = snapshot_from_journey(doc)
    assert "\x1b" not in snapshot.info.name and "\x07" not in snapshot.info.name
    assert snapshot.info.name == "<0x1B>]0;PWNED-TITLE<0x07><0x1B>[2J"


def test_a_control_character_in_a_key_the_file_names_is_escaped_in_the_one_line():
    """Found by the fuzzing above: a grammars key of "\\x1f" reached the error message raw."""
    check(mutate(copy.deepcopy(VALID), ("grammars",), {"\x1f": None}))
