"""The trace document has one shape whatever runs the model: what a backend cannot give is null in
every step and named, with why, in the document's `not_given`."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.documents import trace_document
from tokenviz.journey.session import Session
from tokenviz.worker.snapshots import snapshot_of


def keys(value: object, at: str = "") -> set[str]:
    """Every key path of a JSON value (a list's entries as one), to compare shapes."""
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in {f"{at}.{k}", *keys(v, f"{at}.{k}")}}
    if isinstance(value, list):
        return set().union(*(keys(v, f"{at}[]") for v in value))
    return set()


@pytest.fixture
def snapshot(tiny):
    session = Session(ModelRunner(tiny), SamplingSettings(temperature=0.8, seed=3))
    session.start("The capital of France is")
    for _ in range(3):
        session.step()
    return snapshot_of(session)


def test_a_served_models_document_has_the_local_ones_shape_with_nulls_named(snapshot):
    local = trace_document(snapshot)
    info = dataclasses.replace(
        snapshot.info, covers=20, requests="the server at 127.0.0.1:8000", numbers_of="the server", draws="the server"
    )
    served = trace_document(dataclasses.replace(snapshot, info=info))
    assert keys(served["steps"]) == {k for k in keys(local["steps"]) if not k.startswith("[].kv.")}  # (kv: null)
    assert local["not_given"] == {"ms.request": "no request: the pass runs in this process (ms.forward)"}
    assert served["not_given"].keys() == {"top.logit", "entropy", "ms.forward", "kv"}
    for mine, theirs in zip(local["steps"], served["steps"]):
        assert mine["ms"]["request"] is None and mine["ms"]["forward"] > 0 and mine["kv"]["len"] > 0
        assert theirs["ms"]["forward"] is None and theirs["ms"]["request"] == mine["ms"]["forward"]
        assert theirs["kv"] is None and theirs["entropy"] is None
        assert mine["entropy"] == mine["entropy_floor"] == theirs["entropy_floor"]
        for a, b in zip(mine["top"], theirs["top"]):
            assert a["logprob"] == pytest.approx(math.log(a["prob"])) and b["logit"] is None
            assert b["logprob"] == a["logit"]  # (a top N's 'logit' is its log-probability)
