"""One set of types is the journey record: the contract's records are what a file holds, what reads
it (their annotations, checked by pydantic) and its JSON Schema."""

import ast
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from apptools import frozen_recording

import tokenviz
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Steering, intervention_from_json
from tokenviz.contract.records import Candidate, ModelInfo, PromptPrediction, StepRecord, TokenChip
from tokenviz.contract.results import Analyses, Attribution
from tokenviz.files import journey_schema
from tokenviz.files.documents import trace_document
from tokenviz.files.journey_file import journey_file, recording_of
from tokenviz.files.journey_schema import journey_json_schema, parse_journey
from tokenviz.files.record_json import intervention_json


@pytest.fixture(scope="module")
def recorded():
    snapshot, attention, _ = frozen_recording(steps=4)
    attribution = Attribution("loo", 2, snapshot.chips[3].id, "x", -1.5, (0.1, -0.2, 0.3))
    analyses = Analyses(attributions=(attribution,))
    return snapshot, attention, analyses, json.loads(json.dumps(journey_file(snapshot, attention, analyses)))


def test_a_file_reads_back_as_the_records_it_was_saved_from(recorded):
    snapshot, _, analyses, doc = recorded
    read = recording_of(doc)
    assert read.snapshot.records == snapshot.records and read.snapshot.chips == snapshot.chips
    assert read.snapshot.info == snapshot.info and read.analyses.attributions == analyses.attributions
    first, saved = snapshot.records[0], read.snapshot.records[0]
    assert tuple(saved.prompt_predictions) == tuple(first.prompt_predictions) and len(first.prompt_predictions) > 2
    assert type(saved) is StepRecord and type(read.snapshot.info) is ModelInfo  # the contract's, no mirror
    assert all(type(chip) is TokenChip for chip in read.snapshot.chips)


def test_small_records_are_rows_wherever_they_sit(recorded):
    """A candidate is a row of four in a record's top and inside each prompt prediction alike (a
    class used again is the same row: pydantic's reference is to the row, not its fields)."""
    _, _, _, doc = recorded
    record = doc["replay"]["records"][0]
    prediction = record["prompt_predictions"][0]
    assert isinstance(prediction, list) and len(prediction) == len(PromptPrediction.__dataclass_fields__) - 1
    candidates = [*record["top"], *prediction[1], *doc["replay"]["records"][1]["top"]]
    assert candidates and all(isinstance(c, list) and len(c) == 4 for c in candidates)
    assert all(isinstance(chip, list) for chip in doc["replay"]["chips"])
    assert doc["replay"]["records"][1]["decision"]["stages"][0][0] == "temperature"


def test_the_json_schema_made_from_the_records_accepts_a_saved_file_and_refuses_a_damaged_one(recorded):
    _, _, _, doc = recorded
    schema = journey_json_schema()
    jsonschema.validate(doc, schema)  # (raises where the file and the schema disagree)
    candidate = schema["$defs"]["Candidate"]
    assert candidate["type"] == "array" and [item["title"] for item in candidate["prefixItems"]] == [
        f.name.capitalize() for f in dataclasses.fields(Candidate)
    ]
    damaged = json.loads(json.dumps(doc))
    damaged["replay"]["records"][0]["prompt_predictions"][0][1][0][3] = 1.5  # a probability above 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(damaged, schema)
    with pytest.raises(TokenvizError, match=r"records\.0\.prompt_predictions\.0\.top\.0\.prob"):
        parse_journey(damaged)


def test_a_row_of_the_wrong_length_is_named(recorded):
    _, _, _, doc = recorded
    damaged = json.loads(json.dumps(doc))
    damaged["replay"]["records"][1]["top"][0] = [1, "x", 0.5]
    with pytest.raises(TokenvizError, match=r"records\.1\.top\.0: a candidate is a list of 4 values, not 3"):
        parse_journey(damaged)
    damaged["replay"]["records"][1]["top"][0] = [1, "x", 0.5, 0.1]
    damaged["replay"]["chips"][0] = [1, "x", True]
    with pytest.raises(TokenvizError, match=r"chips\.0: a token chip is a list of 4 to 5 values, not 3"):
        parse_journey(damaged)


def test_the_schema_module_declares_no_record_of_its_own():
    """The envelope only: every record class a file holds is the contract's."""
    own = {name for name, value in vars(journey_schema).items() if isinstance(value, type)}
    mirrors = {"Info", "Record", "Decision", "Branch", "SavedAttribution", "SavedLogitDifference", "SavedRouting"}
    assert not own & mirrors


def test_the_document_and_the_file_write_a_record_alike(recorded):
    """One serialization: the model, each step's settings, watched tokens and interventions are in the
    trace document as the file's records hold them (pydantic's dump of the record), not a second writer."""
    snapshot, _, _, doc = recorded
    document = trace_document(snapshot)
    assert document["model"] == doc["replay"]["info"]
    for step, record in zip(document["steps"], doc["replay"]["records"]):
        assert step["settings"] == record["decision"]["settings"]
    steering = Steering(layer=1, scale=4.0, toward="love", away="hate")
    assert intervention_from_json(intervention_json(steering)) == steering


def test_the_contract_names_no_any_and_no_record_writes_its_own_json():
    """`contract/` says every type it hands over (JsonValue where a file's JSON is meant), and no class
    anywhere has a hand-written `to_json`: pydantic serializes the records (files.record_json)."""
    package = Path(tokenviz.__file__).parent
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.FunctionDef) and node.name == "to_json"), f"{path}:{node.lineno}"
            if path.parent.name == "contract":
                named = isinstance(node, ast.Name) and node.id == "Any"
                named |= isinstance(node, ast.Attribute) and node.attr == "Any"
                named |= isinstance(node, ast.alias) and node.name == "Any"
                assert not named, f"{path.name}:{getattr(node, 'lineno', '')} names Any"
