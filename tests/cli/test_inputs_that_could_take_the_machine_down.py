"""Inputs that could take the machine down: grammars that crashed the process, files that never end,
configs that grew without bound, and the checks that come before a weight is read.

The commands that could take the machine down run in a child process, under a time limit and an
address-space cap; each must end in one line and exit 2, never a signal, a traceback or a hang.
"""

import itertools
import json
import os
import resource
import string
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import invoke
from tiny import save_tiny

pytestmark = pytest.mark.hostile  # (inputs made to take the machine down, in capped child processes)

CHILD_LIMIT_S = 120  # generous: a busy 2-core machine imports torch in seconds
ADDRESS_SPACE = 6 << 30  # the child's cap: torch and the grammar's deep stack fit; a runaway does not
PEAK_MB = 1024  # what judging a config may take

CHILD = """
import json, sys
out, sys.argv = sys.argv[1], ["tokenviz", *sys.argv[2:]]
from tokenviz.cli import run
code = 0
try:
    run()
except SystemExit as exc:
    code = exc.code or 0
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
open(out, "w").write(json.dumps({"peak_mb": peak / 1024}))
sys.exit(code)
"""


def run_child(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """(exit code, stderr, peak MB) of `tokenviz ARGS` in a child under the limits."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    report = tmp_path / "peak.json"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(report), *args],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=CHILD_LIMIT_S,
        stdin=subprocess.DEVNULL,
    )
    peak = json.loads(report.read_text())["peak_mb"] if report.exists() else float("nan")
    return done.returncode, done.stderr, peak


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def chain_grammar(rules: int) -> str:
    """A Lark grammar of `rules` rules, each referring to the next (llguidance compiles it recursively)."""
    return "\n".join(["start: r0", *(f'r{i}: r{i + 1} | "x"' for i in range(rules)), f'r{rules}: "z"'])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-round4"), "llama", context=64)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fails the test if a model's weights start to load: what is checked must be checked before."""
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("the weights were loaded before the check")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


# ---- grammars that crashed the process ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["trace", "score", "compare"])
def test_a_grammar_of_3000_chained_rules_is_one_line_not_a_segfault(tmp_path, tiny_dir, command):
    grammar = tmp_path / "chain.lark"
    grammar.write_text(chain_grammar(3000))
    if command == "compare":
        args = ["compare", "hi", "--model", tiny_dir, "--json", "--steps", "2", "--against-grammar", str(grammar)]
    else:
        args = [command, "hi", "--model", tiny_dir, "--grammar", str(grammar)]
    code, err, _ = run_child(tmp_path, *args)
    assert code == 2, err  # (it was -11: SIGSEGV)
    assert "chain.lark" in one_error(err)


def test_the_engine_compiles_the_longest_chain_allowed_and_refuses_a_longer_one():
    """20,000 chained rules compile on the deep stack (2,000 was the most the default stack held); more
    are refused by count before the engine sees them."""
    from tokenviz.contract.errors import SettingsError
    from tokenviz.contract.grammar import Grammar
    from tokenviz.files.grammar_file import MAX_GRAMMAR_RULES, engine_grammar

    names = ["".join(p) for p in itertools.islice(itertools.product(string.ascii_lowercase, repeat=4), 30_001)]

    def chain(n: int) -> str:
        return "\n".join([f"start: {names[0]}", *(f"{names[i]}:{names[i + 1]}" for i in range(n)), f'{names[n]}:"z"'])

    assert engine_grammar(Grammar("grammar", chain(MAX_GRAMMAR_RULES - 2), "long.lark"))
    with pytest.raises(SettingsError, match=r"has 25,002 rules; at most 20,000"):
        engine_grammar(Grammar("grammar", chain(25_000), "longer.lark"))


@pytest.mark.parametrize(
    "kind, text, said",
    [
        ("grammar", "start: " + " | ".join(f'"a{i}"' for i in range(22_000)), "Current row has 22001 items"),
        ("grammar", 'root ::= "a"{1000000}\n', "Too many items"),
        ("regex", "a{1000}{1000}", "too many expressions"),
        ("regex", r"[^\x00-\x{10FFFF}]", "admits no text at all"),
        ("grammar", "start: b\nb: a\na: b\n", "admits no text at all"),
        ("json-schema", json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}), "admits no text"),
    ],
)
def test_a_grammar_the_engine_refuses_later_is_refused_before_the_weights_load(
    tmp_path, monkeypatch, capsys, tiny_dir, no_weights_read, kind, text, said
):
    if kind == "regex":
        given = ["--regex", text]
    else:
        (tmp_path / "g.txt").write_text(text)
        given = [f"--{kind}", str(tmp_path / "g.txt")]
    code, out, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--steps", "2", *given)
    assert code == 2 and said in one_error(err) and out == ""


def test_a_grammar_that_admits_text_still_runs(monkeypatch, capsys, tiny_dir):
    code, out, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--steps", "3",
                            "--regex", "[a-z ]+", "--json")  # fmt: skip
    assert code == 0, err
    assert all(c.isalpha() or c == " " for c in json.loads(out)["text"][len("hi") :])


def test_an_engine_error_quoting_a_huge_pattern_is_one_short_line(monkeypatch, capsys):
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--regex", "(" * 10_000 + "a" + ")" * 10_000)
    line = one_error(err)
    assert code == 2 and "nested parentheses" in line and len(line) < 600  # (it was 20 KB: the pattern twice)


# ---- files that never end, and JSON nested without bound ---------------------------------------------


@pytest.mark.parametrize("option", ["--json-schema", "--device-map", "compare"])
def test_a_fifo_is_refused_at_once_not_read_for_ever(tmp_path, tiny_dir, fifo, option):
    if option == "compare":
        args = ["compare", "hi", "--model", tiny_dir, "--json", "--against-grammar", f"json-schema {fifo}"]
    else:
        args = ["trace", "hi", "--model", tiny_dir, option, str(fifo)]
    code, err, _ = run_child(tmp_path, *args)  # (it blocked until killed)
    assert code == 2 and "not a regular file" in one_error(err)


async def test_the_app_survives_a_fifo_and_the_crashing_grammar_with_its_journey(tmp_path, fifo):
    from apptools import answer_dialog, make_app, settle, wait_for

    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.screens import GrammarDialog

    (tmp_path / "chain.lark").write_text(chain_grammar(3000))
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        before = await settle(app, pilot)
        for line, said in [(f"json-schema {fifo}", "not a regular file"), (str(tmp_path / "chain.lark"), "chain.lark")]:
            await answer_dialog(app, pilot, "G", GrammarDialog, line)
            await wait_for(lambda said=said: any(said in str(n.message) for n in app._notifications), pilot, 60)
            s = await settle(app, pilot)
            assert s.records == before.records and s.settings == before.settings
        await pilot.press("space")  # and the journey goes on
        assert len((await settle(app, pilot)).records) == len(before.records) + 1


@pytest.mark.parametrize("option", ["--json-schema", "--device-map"])
def test_json_nested_past_the_parser_is_one_line(tmp_path, monkeypatch, capsys, option):
    if option == "--json-schema":
        opened, closed = '{"type": "object", "properties": {"a": ', '}, "required": ["a"]}'
        text = opened * 600 + '{"type": "string"}' + closed * 600  # (json.dumps itself cannot nest it)
    else:
        text = "[" * 100_000
    (tmp_path / "deep.json").write_text(text)
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", option, str(tmp_path / "deep.json"))
    assert code == 2 and "nests too deeply" in one_error(err)  # (a RecursionError traceback)


def test_a_device_map_over_the_size_read_is_called_too_large_not_not_json(tmp_path, monkeypatch, capsys):
    (tmp_path / "big.json").write_text(json.dumps({f"model.layers.{i}": "cpu" for i in range(100_000)}))
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--device-map", str(tmp_path / "big.json"))
    assert code == 2 and "larger than the 1,048,576 bytes tokenviz reads" in one_error(err)


# ---- configs judged by arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [20_000, 1_000_000])
def test_a_config_of_many_layers_is_refused_in_bounded_time_and_memory(tmp_path, tiny_dir, layers):
    directory = tmp_path / "huge"
    directory.mkdir()
    for file in Path(tiny_dir).iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    code, err, peak = run_child(tmp_path, "trace", "hi", "--model", str(directory))
    assert code == 2 and f"{layers:,} layers and its weights hold 3" in one_error(err)
    assert peak < PEAK_MB  # (20,000 layers had taken 2.0 GB; 1,000,000 never finished)


def test_a_config_past_the_layers_built_is_counted_as_a_build_would_count_it(monkeypatch):
    """The count of a config of many layers comes from builds of one and two: equal to the whole build
    for every family of the matrix whose layers are alike (Gemma 4's differ by layer type)."""
    from families import FAMILIES, family_config

    from tokenviz.backends.transformers import memory

    for kind in FAMILIES:
        config = family_config(kind)
        whole = memory.parameter_count(config)
        with monkeypatch.context() as patched:
            patched.setattr(memory, "BUILT_LAYERS", 1)
            counted = memory.parameter_count(config)
        assert (counted.total, counted.in_linears) == (whole.total, whole.in_linears), kind


def test_a_config_smaller_than_its_tokenizer_is_one_line(tmp_path, monkeypatch, capsys, tiny_dir):
    directory = tmp_path / "small-vocab"
    directory.mkdir()
    for file in Path(tiny_dir).iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", str(directory))
    assert code == 2 and "a vocabulary of 100 and its tokenizer" in one_error(err)  # (an IndexError at prefill)


@pytest.mark.parametrize("shard", ["../../../../etc/passwd", "../outside/model.safetensors", "/etc/passwd"])
def test_an_index_naming_a_shard_outside_the_directory_is_refused(tmp_path, monkeypatch, capsys, tiny_dir, shard):
    directory = tmp_path / "models" / "sharded"
    directory.mkdir(parents=True)
    for file in Path(tiny_dir).iterdir():
        if file.suffix != ".safetensors":
            (directory / file.name).write_bytes(file.read_bytes())
    (tmp_path / "models" / "outside").mkdir()
    (tmp_path / "models" / "outside" / "model.safetensors").write_bytes(
        (Path(tiny_dir) / "model.safetensors").read_bytes()
    )
    from safetensors import safe_open

    with safe_open(str(Path(tiny_dir) / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", str(directory))
    assert code == 2 and "outside the model's directory" in one_error(err) and repr(shard) in err


# ---- checks made before the weights load -------------------------------------------------------------


@pytest.mark.parametrize(
    "args, said",
    [
        (["--ablate", "9.0"], "the model's layers are 0-2"),
        (["--ablate", "1.7"], "the model's heads are 0-3"),
        (["--steer", "5:2:a:b"], "the model's layers are 0-2"),
        (["--patch", "1:40:hello"], "its source has positions 0-"),
    ],
)
def test_intervention_limits_are_checked_before_the_weights_load(
    monkeypatch, capsys, tiny_dir, no_weights_read, args, said
):
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, *args)
    assert code == 2 and said in one_error(err)


def test_steer_tokens_take_ids_on_either_side(monkeypatch, capsys, tiny_dir):
    from tokenviz.contract.interventions import parse_steering

    steering = parse_steering("5:1:id:100:id:200", by="tokens")
    assert (steering.toward, steering.away) == ("id:100", "id:200")
    steering = parse_steering("5:1: Paris:id:7", by="tokens")
    assert (steering.toward, steering.away) == (" Paris", "id:7")
    code, out, err = invoke(monkeypatch, capsys, "trace", "The cat", "--model", tiny_dir, "--steps", "2", "--json",
                            "--steer-tokens", "1:2:id:100:id:200")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["steps"][0]["interventions"]
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--steer-tokens", "1:2:The cat:id:5")
    assert code == 2 and "steer by a single token" in one_error(err)


def test_an_output_directory_is_checked_before_any_work(tmp_path, monkeypatch, capsys, tiny_dir):
    code, _, err = invoke(
        monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--save", str(tmp_path / "no" / "x.json")
    )
    assert code == 2 and "there is no directory" in one_error(err)
    assert "checking that" not in err  # (the trace had run whole first)


def test_offload_options_that_do_nothing_are_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    for args, said in [
        (["--offload-dir", str(tmp_path)], "goes with --device-map"),
        (["--device-map", "auto", "--offload-dir", str(tmp_path / "file")], "is not a directory"),
        (["--device-map", "auto", "--offload-dir", "/proc/self"], "cannot hold files"),
    ]:
        code, _, err = invoke(monkeypatch, capsys, "trace", "hi", *args)
        assert code == 2 and said in one_error(err)


def test_a_device_map_naming_a_module_the_model_lacks_names_it(tmp_path, monkeypatch, capsys, tiny_dir):
    mapping = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    (tmp_path / "map.json").write_text(json.dumps({**mapping, "model.nope": "cpu"}))
    code, _, err = invoke(
        monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--device-map", str(tmp_path / "map.json")
    )
    assert code == 2 and "names 'model.nope', which" in one_error(err)


# ---- replay --verify on the model recorded ---------------------------------------------------------------


def test_verify_uses_the_recorded_model_and_says_when_another_is_given(tmp_path, monkeypatch, capsys, tiny_dir):
    journey = tmp_path / "j.json"
    code, _, err = invoke(
        monkeypatch, capsys, "trace", "The cat", "--model", tiny_dir, "--steps", "3", "--save", str(journey)
    )
    assert code == 0, err
    code, out, err = invoke(monkeypatch, capsys, "replay", str(journey), "--verify")
    assert code == 0 and "verified" in out and f"verifying on {tiny_dir}" in err  # (not the bundled model)
    other = tmp_path / "other"
    from tiny import tiny_model

    loaded = tiny_model("llama", 64, seed=3)
    loaded.model.save_pretrained(other)
    loaded.tokenizer.save_pretrained(other)
    code, _, err = invoke(monkeypatch, capsys, "replay", str(journey), "--verify", "--model", str(other))
    assert f"the journey was recorded on {tiny_dir}; verifying on {other}" in err
    assert code == 0 or "recorded on another model" in err


def test_a_steering_that_saturates_the_logits_says_so(monkeypatch, capsys, tiny_dir):
    def first_step(scale: str) -> dict:
        code, out, err = invoke(monkeypatch, capsys, "trace", "The cat", "--model", tiny_dir, "--steps", "1",
                                "--json", "--steer", f"1:{scale}:The cat:The dog")  # fmt: skip
        assert code == 0, err
        return json.loads(out)["steps"][0]

    drowned = first_step("1e30")
    assert drowned["saturated"] is True and len({c["logit"] for c in drowned["top"]}) == 1
    assert "saturated" not in first_step("2")


@pytest.mark.bundled
def test_a_cache_without_room_falls_back_to_memory_and_says_so(tmp_path, monkeypatch):
    """A cache directory on a full or tiny filesystem is skipped as an unwritable one is (it had refused
    the bundled model: "cannot be opened here", with gigabytes of memory free)."""
    from collections import namedtuple

    import torch

    from tokenviz.backends.transformers import gguf_cache, loading

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(gguf_cache.shutil, "disk_usage", lambda path: usage(2**20, 0, 2**20))  # 1 MB free
    messages: list[str] = []
    loaded = loading.load_model(None, device="cpu", progress=lambda m, f: messages.append(m))
    said = [m for m in messages if "in memory" in m]
    assert len(said) == 1 and "has 1.0 MB free" in said[0]
    assert not any(gguf_cache.cache_root().glob("models/*/model*.safetensors"))
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([[504, 414, 46682]])).logits
    assert logits[0, -1].argmax().item() == 18669  # " Tower": the same weights


def test_a_prompt_holding_a_token_the_embeddings_lack_is_one_line(tmp_path, monkeypatch, capsys):
    """Qwen2's tokenizer class adds <|endoftext|> past a vocabulary the config keeps at 300: the model
    loads (its own text never reaches that id), and a prompt that names the token is refused."""
    from families import family_model

    saved = family_model("qwen2")
    saved.model.save_pretrained(tmp_path)
    saved.tokenizer.save_pretrained(tmp_path)
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi <|endoftext|>", "--model", str(tmp_path), "--steps", "1")
    assert code == 2 and "past the model's vocabulary of 300" in one_error(err)  # (an IndexError at prefill)
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", str(tmp_path), "--steps", "1")
    assert code == 0, err


def test_replay_verify_of_a_journey_holding_the_crashing_grammar_is_one_line(tmp_path, tiny_dir):
    """A journey file whose grammar is the 3,000-rule chain, its digest correct: replay --verify had
    died of SIGSEGV; the grammar is now one line (and exit 2) in a child under the limits."""
    import hashlib

    journey = tmp_path / "j.json"
    code, err, _ = run_child(tmp_path, "trace", "The cat", "--model", tiny_dir, "--steps", "2", "--regex", "[a-z ]+",
                             "--save", str(journey))  # fmt: skip
    assert code == 0, err
    raw = journey.read_text()
    old = next(iter(json.loads(raw)["grammars"]))
    text = chain_grammar(3000)
    new = hashlib.sha256(f"grammar\0{text}".encode()).hexdigest()[:16]
    doc = json.loads(raw.replace(old, new))
    for grammar in doc["grammars"].values():
        grammar.update(kind="grammar", source="chain.lark", text=text)

    def regrammar(node):  # every settings' grammar names the chain now
        if isinstance(node, dict):
            if node.get("digest") == new:
                node.update(kind="grammar", source="chain.lark")
            for value in node.values():
                regrammar(value)
        elif isinstance(node, list):
            for value in node:
                regrammar(value)

    regrammar(doc)
    journey.write_text(json.dumps(doc))
    code, err, _ = run_child(tmp_path, "replay", str(journey), "--verify", "--model", tiny_dir)
    assert code == 2 and "the grammar chain.lark cannot be followed" in one_error(err)
