"""The grammar stage against generate() with llguidance's own matcher as its logits processor, and
the grammar's state following the journey: rewinds, forced tokens, settings, saved journeys."""

import json
import re

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import pytest
import torch
from tiny import tiny_model
from transformers import GenerationConfig, LogitsProcessor

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode
from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.settings import SamplingSettings, grammars_from_json
from tokenviz.decoding.sampling import final_distribution
from tokenviz.files.grammar_file import engine_grammar, read_grammar
from tokenviz.files.journey_file import open_journey, recording_of, save_journey
from tokenviz.files.record_json import as_json, grammars_json, settings_json
from tokenviz.journey.reproduce import verify_journey
from tokenviz.journey.session import Session
from tokenviz.worker.snapshots import saved_attention_of, snapshot_of

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 999}},
    "required": ["name", "age"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # (llguidance's: compact JSON, so no random model loops on spaces)
}
JSON_SCHEMA = Grammar("json-schema", json.dumps(SCHEMA), "person.json")
REGEX = Grammar("regex", r"[0-9]{3}-[a-c]{2}", r"[0-9]{3}-[a-c]{2}")
GBNF = Grammar("grammar", 'root ::= ("yes" | "no" | "maybe") "." " "? ("yes" | "no")', "answer.gbnf")


class EngineProcessor(LogitsProcessor):
    """generate()'s reference: a fresh llguidance matcher fed the tokens generated after the prompt,
    masking with llguidance's own numpy helper (not tokenviz's code)."""

    def __init__(self, tokenizer, vocab: int, eos_ids, grammar: Grammar, prompt_len: int):
        engine_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=sorted(eos_ids))
        self.matcher = llguidance.LLMatcher(engine_tokenizer, engine_grammar(grammar))
        self.vocab, self.prompt_len, self.fed = vocab, prompt_len, 0

    def __call__(self, input_ids, scores):
        generated = input_ids[0, self.prompt_len :].tolist()
        assert self.matcher.consume_tokens(generated[self.fed :])
        self.fed = len(generated)
        bitmask = llguidance.numpy.allocate_token_bitmask(1, self.vocab)
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask)
        masked = scores.float().numpy().copy()
        llguidance.numpy.apply_token_bitmask_inplace(masked, bitmask)
        return torch.from_numpy(masked).to(scores.dtype)

    def allowed(self) -> np.ndarray:
        bitmask = llguidance.numpy.allocate_token_bitmask(1, self.vocab)
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask)
        bits = (bitmask[0][:, None] >> np.arange(32)) & 1
        return bits.reshape(-1)[: self.vocab].astype(bool)


def run(session: Session) -> None:
    while session.step() is not None:
        pass


def reference_processor(session: Session, grammar: Grammar) -> EngineProcessor:
    r = session.engine
    return EngineProcessor(r.tokenizer, r.info.vocab, r.eos_ids, grammar, len(session.prompt_ids))


def generate_greedy(session: Session, grammar: Grammar, n: int) -> list[int]:
    """generate()'s greedy tokens under the engine's processor, the end of sequence left out."""
    runner = session.engine
    out = runner.model.generate(
        torch.tensor([session.prompt_ids]),
        attention_mask=torch.ones(1, len(session.prompt_ids), dtype=torch.long),
        generation_config=GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=sorted(runner.eos_ids)),
        logits_processor=[reference_processor(session, grammar)],
    )[0, len(session.prompt_ids) :].tolist()
    return [t for t in out if t not in runner.eos_ids]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("grammar", [JSON_SCHEMA, REGEX, GBNF], ids=["json-schema", "regex", "gbnf"])
def test_greedy_tokens_equal_generate_with_the_engines_processor(kind, grammar):
    settings = SamplingSettings(temperature=0, grammar=grammar, max_new_tokens=60)
    session = Session(ModelRunner(tiny_model(kind)), settings)
    session.start("Answer:")
    run(session)
    assert session.generated_ids == generate_greedy(session, grammar, 61)
    assert session.stop_reason == "the grammar is complete"
    text = session.generated_text
    if grammar is REGEX:
        assert re.fullmatch(r"[0-9]{3}-[a-c]{2}", text)
    elif grammar is GBNF:
        assert re.fullmatch(r"(yes|no|maybe)\. ?(yes|no)", text)
    else:
        value = json.loads(text)
        assert set(value) == {"name", "age"} and isinstance(value["name"], str) and isinstance(value["age"], int)


def test_every_stage_and_the_allowed_set_equal_generates_processors_at_every_step():
    """Sampled, with a repetition penalty, temperature, top-k and top-p: at each step of the
    journey, the distribution drawn from equals generate()'s processed scores (its processors with
    the engine's in the place generate() gives it), and the stage's allowed count equals the
    engine's bitmask."""
    settings = SamplingSettings(
        temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.2, seed=3, grammar=JSON_SCHEMA, max_new_tokens=30
    )
    session = Session(ModelRunner(tiny_model("llama")), settings)
    session.start("Answer:")
    run(session)
    n, model = len(session.prompt_ids), session.engine.model
    config = GenerationConfig(
        do_sample=True, temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.2, max_new_tokens=1
    )
    for record in session.records:
        context = session.ids[: record.position]
        reference = reference_processor(session, JSON_SCHEMA)
        out = model.generate(
            torch.tensor([context]),
            attention_mask=torch.ones(1, len(context), dtype=torch.long),
            generation_config=config,
            logits_processor=[reference],
            output_scores=True,
            return_dict_in_generate=True,
        )
        expected = torch.softmax(out.scores[0][0].float(), -1)
        logits = model(torch.tensor([context])).logits[0, -1]
        mine = final_distribution(
            logits, settings, context, context[n:], session.grammars.allowed(settings, context[n:])
        )
        torch.testing.assert_close(mine, expected, atol=1e-5, rtol=1e-4)
        (stage,) = [s for s in record.decision.stages if s.is_grammar]
        assert stage.kept == int(reference.allowed().sum())
        assert [s.name for s in record.decision.stages] == ["repetition", "grammar", "temperature", "top-k", "top-p"]
        assert record.decision.chosen_id == session.ids[record.position] or record is session.records[-1]


def test_a_rewind_gives_the_mask_a_fresh_matcher_gives_and_the_journey_goes_on_the_same():
    settings = SamplingSettings(temperature=0.9, seed=1, grammar=JSON_SCHEMA, max_new_tokens=12)
    session = Session(ModelRunner(tiny_model("llama")), settings)
    session.start("Answer:")
    for _ in range(10):
        session.step()
    first = list(session.ids)
    for back in (3, 1, 6):
        session.rewind(back)
        fresh = reference_processor(session, JSON_SCHEMA)
        fresh.matcher.consume_tokens(session.generated_ids)
        mine = session.grammars.allowed(settings, session.generated_ids)
        assert np.array_equal(mine.numpy(), fresh.allowed())
        (stage,) = [s for s in session.pending.decision.stages if s.is_grammar]
        assert stage.kept == int(fresh.allowed().sum())
        while len(session.ids) < len(first):
            session.step()
        assert session.ids == first


def test_a_forbidden_forced_token_is_refused_and_nothing_changes():
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, grammar=REGEX))
    session.start("Answer:")
    session.step()
    before_ids, before_pending = list(session.ids), session.pending
    letter = session.engine.encode("a")[0]  # a letter where a digit must come
    with pytest.raises(TokenvizError, match="not allowed here by the grammar"):
        session.step(forced_id=letter)
    assert session.ids == before_ids and session.pending == before_pending
    digit = session.engine.encode("7")[0]
    session.step(forced_id=digit)  # an allowed one is taken
    assert session.ids[-1] == digit


def test_only_one_allowed_token_is_shown_as_forced_by_the_grammar():
    grammar = Grammar("regex", "hello world", "hello world")
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, grammar=grammar))
    session.start("Say:")
    run(session)
    assert session.generated_text == "hello world"
    stages = [next(s for s in r.decision.stages if s.is_grammar) for r in session.records]
    assert all(s.kept == 1 for s in stages)  # one way to write it in these tokens at each step
    assert all(0 <= s.removed <= 1 for s in stages)


def test_a_grammar_the_text_so_far_leaves_is_refused_and_clearing_it_resumes():
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, max_new_tokens=4))
    session.start("Answer:")
    session.step(forced_id=session.engine.encode("x")[0])
    before = session.settings
    with pytest.raises(TokenvizError, match=r"leaves the grammar .* at generated token 1"):
        session.set_settings(before.replace(grammar=REGEX))
    assert session.settings == before
    session.rewind(1)
    session.set_settings(before.replace(grammar=REGEX))  # from the prompt it fits
    run(session)
    assert session.stop_reason == "max new tokens (4)" and re.fullmatch(r"[0-9]{3}-", session.generated_text)
    session.set_settings(session.settings.replace(grammar=None, max_new_tokens=6))
    assert session.step() is not None  # no grammar: it goes on


def test_a_journey_saves_its_grammar_once_and_replays_and_verifies_with_it(tmp_path):
    settings = SamplingSettings(temperature=0.7, seed=5, grammar=GBNF, max_new_tokens=20)
    session = Session(ModelRunner(tiny_model("llama")), settings)
    session.start("Answer:")
    run(session)
    path = save_journey(tmp_path / "j.json", snapshot_of(session), saved_attention_of(session))
    raw = path.read_text()
    assert raw.count(json.dumps(GBNF.text)[1:-1]) == 1  # the grammar's text once, whatever the steps
    recording = recording_of(open_journey(path))
    assert recording.snapshot.settings.grammar == GBNF
    assert all(r.decision.settings.grammar == GBNF for r in recording.snapshot.records)
    assert recording.snapshot.records[0].decision.stages[0].name == "grammar"
    fresh = Session(ModelRunner(tiny_model("llama")))
    assert verify_journey(json.loads(raw), fresh) == (len(session.generated_ids), None)


def test_a_journey_file_naming_a_grammar_it_does_not_hold_is_refused(tmp_path):
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, grammar=REGEX))
    session.start("Answer:")
    session.step()
    path = save_journey(tmp_path / "j.json", snapshot_of(session))
    doc = json.loads(path.read_text())
    doc["grammars"] = {}
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenvizError, match="grammar the file does not hold"):
        open_journey(path)
    doc["grammars"] = {REGEX.digest: {**as_json(REGEX), "text": "[0-9]+"}}  # a text that is not its digest's
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenvizError, match="does not match its text"):
        open_journey(path)


def test_grammars_are_written_once_and_read_back_by_digest():
    settings = [SamplingSettings(grammar=REGEX), SamplingSettings(temperature=0, grammar=REGEX), SamplingSettings()]
    table = grammars_json(settings)
    assert list(table) == [REGEX.digest]
    back = grammars_from_json(json.loads(json.dumps(table)))
    assert SamplingSettings.from_json(settings_json(settings[1]), back) == settings[1]
    with pytest.raises(SettingsError, match="not given"):
        SamplingSettings.from_json(settings_json(settings[1]))


def test_beams_and_speculation_say_they_do_not_follow_a_grammar():
    from tokenviz.cli.headless import beam_document

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, grammar=REGEX))
    session.start("Answer:")
    with pytest.raises(TokenvizError, match="beam search does not follow a grammar"):
        beam_document(session, session.ids, 2, 3)
    drafter = make_drafter("prompt-lookup", session.engine)
    with pytest.raises(TokenvizError, match="speculative decoding does not follow a grammar"):
        speculative_decode(session.engine, session.ids, drafter, 4, session.settings)


@pytest.mark.parametrize(
    "kind, text, message",
    [
        ("json-schema", "{not json", "is not JSON"),
        ("json-schema", '{"type": "objec"}', "is not valid"),
        ("regex", "(", "is not valid"),
        ("grammar", 'root ::= ("a"', "is not valid"),
        ("grammar", "   ", "is empty"),
    ],
)
def test_a_wrong_grammar_is_one_line(tmp_path, kind, text, message):
    if kind == "regex":
        given = text
    else:
        (tmp_path / "g").write_text(text)
        given = str(tmp_path / "g")
    with pytest.raises(SettingsError, match=message) as caught:
        read_grammar(kind, given)
    assert "\n" not in str(caught.value)


def test_a_grammar_file_that_is_missing_binary_or_too_large_is_one_line(tmp_path):
    with pytest.raises(SettingsError, match="cannot read"):
        read_grammar("grammar", str(tmp_path / "absent"))
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00root")
    with pytest.raises(SettingsError, match="not UTF-8"):
        read_grammar("grammar", str(tmp_path / "bin"))
    (tmp_path / "big").write_bytes(b"a" * (4 * 256_000 + 10))
    with pytest.raises(SettingsError, match="larger than"):
        read_grammar("grammar", str(tmp_path / "big"))


@pytest.mark.bundled
@pytest.mark.parametrize("grammar", [JSON_SCHEMA, REGEX, GBNF], ids=["json-schema", "regex", "gbnf"])
def test_a_grammar_journey_on_the_bundled_model_equals_generate_and_follows_it(bundled, grammar):
    session = Session(ModelRunner(bundled), SamplingSettings(temperature=0, grammar=grammar, max_new_tokens=60))
    session.start("Describe a person as JSON:" if grammar is JSON_SCHEMA else "Answer:")
    run(session)
    assert session.stop_reason == "the grammar is complete"
    assert session.generated_ids == generate_greedy(session, grammar, 61)
    if grammar is REGEX:
        assert re.fullmatch(r"[0-9]{3}-[a-c]{2}", session.generated_text)
        return
    if grammar is GBNF:
        assert re.fullmatch(r"(yes|no|maybe)\. ?(yes|no)", session.generated_text)
        return
    value = json.loads(session.generated_text)
    assert set(value) == {"name", "age"} and len(value["name"]) <= 8 and 0 <= value["age"] <= 999
    removed = [next(s for s in r.decision.stages if s.is_grammar).removed for r in session.records]
    assert max(removed) > 0.5  # the model wanted something else at some step: the stage shows how much
