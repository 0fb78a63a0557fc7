"""The contract is fully typed: every field of the Snapshot, and of every type it carries, has a
concrete type (no Any), and none of them is a torch type."""

import dataclasses
import types
import typing

import numpy as np

from tokenviz.contract.snapshot import Snapshot


def field_types(cls) -> list[tuple[str, object]]:
    hints = typing.get_type_hints(cls)
    return [(f"{cls.__name__}.{f.name}", hints[f.name]) for f in dataclasses.fields(cls)]


def leaves(annotation) -> list[object]:
    """The classes an annotation is made of (tuple[int, ...] | None -> int, NoneType, ...)."""
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return [str]
    return [leaf for arg in args for leaf in leaves(arg)]


def test_the_snapshot_and_everything_it_carries_is_concretely_typed():
    seen, queue, problems = set(), [Snapshot], []
    while queue:
        cls = queue.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, annotation in field_types(cls):
            for leaf in leaves(annotation):
                if leaf is typing.Any or leaf is object:
                    problems.append(name)
                elif dataclasses.is_dataclass(leaf):
                    queue.append(leaf)
                elif leaf not in (int, float, str, bool, bytes, range, types.NoneType, Ellipsis, np.ndarray):
                    problems.append(f"{name}: {leaf!r}")
    assert problems == []
    assert len(seen) >= 15  # Snapshot, records, settings, results: the walk really went through them


def test_a_snapshot_finds_each_views_result_by_the_request_that_asked_for_it():
    from tokenviz.contract.commands import Beams, Inspect, Verify
    from tokenviz.contract.results import Verification

    assert (Verify.result_type, Beams.result_type, Inspect.result_type)[0] is Verification
    verification = Verification(position=3, max_logit_diff=1e-6, max_attention_diff=0.0, argmax_agrees=True)
    s = Snapshot(seq=1, state="ready", results=(verification,))
    assert s.result(Verify) is verification
    assert s.result(Beams) is None and s.result(Inspect) is None
    assert Snapshot(seq=1, state="ready").result(Verify) is None
