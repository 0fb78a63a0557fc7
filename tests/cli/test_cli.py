"""The command line: the trace document, and one clear line with exit code 2 for every bad input."""

import json
import os
import subprocess
import sys

import pytest
from clitools import invoke
from tiny import save_tiny

from tokenviz import __version__
from tokenviz.files.record_json import record_json

PROMPT = "The Eiffel Tower is located in"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", context=32)


@pytest.mark.bundled
def test_trace_json_on_the_bundled_model_as_a_user_runs_it():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "tokenviz", "trace", PROMPT, "--steps", "5", "--temperature", "0", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    # Only tokenviz's own progress, a line each (no bar to redraw in a log), and nothing printed by a
    # library it imports (torchao's, say).
    assert out.stderr.splitlines() == [
        "checking that SmolLM2-135M-Instruct (bundled, Q4_1 GGUF) fits on cpu",
        "prefilling the prompt: 7 of 7 tokens",
    ]
    doc = json.loads(out.stdout)
    assert {"name", "device", "dtype", "layers", "heads"} <= doc["model"].keys()
    assert doc["model"]["layers"] == 30 and doc["model"]["heads"] == 9
    assert [t["id"] for t in doc["prompt"]] == [504, 414, 46682, 18669, 314, 3807, 281]
    assert "".join(t["text"] for t in doc["prompt"]) == PROMPT
    assert len(doc["steps"]) == 5
    for i, step in enumerate(doc["steps"]):
        assert step["index"] == i
        assert step["draw"]["greedy"] is True and step["draw"]["u"] is None
        assert step["chosen"]["id"] == step["top"][0]["id"]  # greedy: the raw argmax
        probs = [t["prob"] for t in step["top"]]
        assert probs == sorted(probs, reverse=True)
        assert set(step["ms"]) == {"forward", "request", "sampling"} and step["ms"]["request"] is None
        assert isinstance(step["stages"], list)
    assert doc["text"] == "".join(s["chosen"]["text"] for s in doc["steps"])
    assert doc["text"].startswith(" the")


def test_trace_json_schema_with_sampling(monkeypatch, capsys, tiny_dir):
    code, out, err = invoke(
        monkeypatch,
        capsys,
        "trace",
        "The cat sat",
        "--model",
        tiny_dir,
        "--steps",
        "4",
        "--temperature",
        "0.9",
        "--top-k",
        "10",
        "--top-p",
        "0.8",
        "--seed",
        "3",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["steps"]) == 4
    for step in doc["steps"]:
        assert [s["name"] for s in step["stages"]] == ["temperature", "top-k", "top-p"]
        assert step["stages"][1]["kept"] == 10
        assert 0 <= step["draw"]["u"] < 1 and step["draw"]["greedy"] is False
        assert 0 < step["chosen"]["prob"] <= 1
        assert {"id", "text", "logit", "prob"} <= step["top"][0].keys()
    again = invoke(
        monkeypatch,
        capsys,
        "trace",
        "The cat sat",
        "--model",
        tiny_dir,
        "--steps",
        "4",
        "--temperature",
        "0.9",
        "--top-k",
        "10",
        "--top-p",
        "0.8",
        "--seed",
        "3",
        "--json",
    )[1]
    assert json.loads(again)["text"] == doc["text"]


def test_trace_table(monkeypatch, capsys, tiny_dir):
    code, out, _ = invoke(
        monkeypatch, capsys, "trace", "The cat sat", "--model", tiny_dir, "--steps", "3", "--temperature", "0"
    )
    assert code == 0
    assert "tiny" not in out or "text:" in out
    assert "text:" in out and "greedy" in out


def test_greedy_is_said_one_way_its_final_distribution_one_hot(monkeypatch, capsys, tiny_dir):
    """Issue 69, finding 20: a greedy trace's p(final) gave the raw p (0.371) where the app shows the
    final distribution one-hot, and a served greedy step said "greedy": false. Argmax takes its token
    with certainty: p(final) is 1, the raw p is the top list's, and every backend says greedy."""
    import dataclasses

    from apptools import frozen_snapshot

    from tokenviz.contract.settings import SamplingSettings

    args = ("trace", "The cat sat", "--model", tiny_dir, "--steps", "3", "--temperature", "0")
    code, out, err = invoke(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    for step in json.loads(out)["steps"]:
        assert step["draw"]["greedy"] is True and step["chosen"]["prob"] == 1.0
        assert step["top"][0]["id"] == step["chosen"]["id"] and step["top"][0]["prob"] < 1
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    rows = [line for line in out.splitlines() if "greedy" in line and "│" in line]
    assert len(rows) == 3 and all("1.000" in row for row in rows), out
    record = frozen_snapshot(steps=1, settings=SamplingSettings(temperature=0)).records[-1]
    drawn = dataclasses.replace(record.decision, mode="drawn")  # (a server's draw under greedy settings)
    assert record_json(dataclasses.replace(record, decision=drawn))["draw"]["greedy"] is True


def test_the_trace_table_says_where_the_lens_and_attention_it_cannot_show_are(monkeypatch, capsys, tiny_dir):
    """Issue 69, finding 10: `trace --lens --attention 20` showed neither in its table, without a word."""
    args = ("trace", "The cat sat", "--model", tiny_dir, "--steps", "2", "--lens", "--attention", "1")
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "--lens and --attention: each step's, in the JSON document (--json)" in " ".join(out.split())


def test_the_trace_table_fits_80_columns_with_whole_headers_and_pieces_apart_from_ids(monkeypatch, capsys, tiny_dir):
    import io

    from rich.console import Console

    from tokenviz.cli.table import print_table

    code, out, _ = invoke(monkeypatch, capsys, "trace", "The cat sat", "--model", tiny_dir, "--steps", "3", "--json")
    assert code == 0
    doc = json.loads(out)
    for width in (80, 160):
        console = Console(file=io.StringIO(), width=width, color_system=None)
        print_table(doc, console)
        text = console.file.getvalue()
        assert all(len(line) <= width for line in text.splitlines())
        for header in ("step", "chosen", "id", "p(final)", "rank", "mode", "top 3 (raw softmax)"):
            assert header in text, (width, header)  # whole, not cut to "p(fin…"
        first = doc["prompt"][0]
        assert f"{first['text']} {first['id']}" in text.replace("·", " ")  # "The 504", never "The504"
    assert "stages kept" in text and "fwd ms" in text  # a wide terminal keeps every column


def test_a_megabyte_token_is_cut_in_the_table_and_whole_in_json(monkeypatch, capsys, tiny_dir):
    """A 1 MB token (a hostile vocabulary's, a server's) made the trace table 66,698 lines."""
    import io

    from rich.console import Console

    from tokenviz.cli.table import PIECE_CHARS, print_table

    code, out, _ = invoke(monkeypatch, capsys, "trace", "The cat sat", "--model", tiny_dir, "--steps", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    huge = "x" * (1 << 20)
    doc["prompt"][0]["text"] = doc["steps"][0]["chosen"]["text"] = doc["steps"][1]["top"][0]["text"] = huge
    console = Console(file=io.StringIO(), width=120, color_system=None)
    print_table(doc, console)
    text = console.file.getvalue()
    assert len(text.splitlines()) < 60 and "x" * (PIECE_CHARS - 1) + "…" in text, len(text.splitlines())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature must be 0 (greedy) or positive"),
        (["--top-p", "1.5"], "top-p must be in (0, 1]"),
        (["--top-k", "-3"], "top-k must be"),
        (["--min-p", "2"], "min-p must be"),
        (["--repetition-penalty", "0"], "repetition penalty must be positive"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--stop", ""], "stop strings must not be empty"),
        (["--device", "tpu"], "unknown device"),
        (["--dtype", "int3"], "unknown dtype"),
    ],
)
def test_bad_settings_give_one_line_and_exit_2(monkeypatch, capsys, tiny_dir, args, message):
    code, out, err = invoke(monkeypatch, capsys, "trace", "Hi", "--model", tiny_dir, *args)
    assert code == 2
    assert err.strip().splitlines() == [f"error: {message}" + err.strip().split(message, 1)[1]]
    assert message in err and "Traceback" not in err and out == ""


def test_bad_models_give_one_line_and_exit_2(monkeypatch, capsys, tmp_path, tiny_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF not really")
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hi")
    cases = [
        (["--model", str(tmp_path / "missing")], "no such model path"),
        (["--model", str(tmp_path / "missing.gguf")], "no such GGUF file"),
        (["--model", str(corrupt)], "broken.gguf is not a GGUF llama.cpp can read: version"),
        (["--model", str(empty)], "could not load model"),
        (["--model", str(text_file)], "is a file, not a model directory"),
        (["--model", "nobody-here/no-such-model-xyz"], "not found on the Hugging Face hub or in its local cache"),
        (["--model", tiny_dir, "--device", "cuda"], "no CUDA GPU"),
    ]
    for args, message in cases:
        code, _, err = invoke(monkeypatch, capsys, "trace", "Hi", *args)
        assert code == 2, (args, err)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0], (args, err)
        assert err.strip().splitlines()[-1] == errors[0] and "Traceback" not in err
    assert not list((tmp_path / "cache").rglob("*.lock"))  # (the broken GGUF is refused before a conversion)


def test_prompt_longer_than_the_context_is_refused(monkeypatch, capsys, tiny_dir):
    code, _, err = invoke(monkeypatch, capsys, "trace", "The cat sat on the mat. " * 10, "--model", tiny_dir)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: the prompt has") and "this model reads at most 32" in last


def test_a_bad_input_in_a_real_process_prints_no_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "tokenviz", "trace", "x", "--top-p", "7"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: top-p must be in (0, 1], got 7.0"


def test_version_and_help(monkeypatch, capsys):
    code, out, _ = invoke(monkeypatch, capsys, "--version")
    assert code == 0 and out.strip() == f"tokenviz {__version__}"
    code, out, _ = invoke(monkeypatch, capsys, "--help")
    assert code == 0
    for flag in (
        "--model",
        "--device",
        "--dtype",
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repetition-penalty",
        "--presence-penalty",
        "--frequency-penalty",
        "--seed",
        "--max-new-tokens",
        "--stop",
        "--theme",
        "--trust-remote-code",
        "--version",
        "--chat",
        "--system",
        "tokenviz replay FILE",
        "tokenviz score TEXT",
        "The Eiffel Tower is",
    ):
        assert flag in " ".join(out.split()), flag  # (the help wraps at the terminal's width)
    code, out, _ = invoke(monkeypatch, capsys, "trace", "--help")
    assert code == 0 and "--json" in out and "--steps" in out


@pytest.mark.bundled
def test_trace_chat_on_the_bundled_instruct_model_answers_as_generate_does(monkeypatch, capsys, bundled):
    import torch

    question = "What is the capital of France?"
    code, out, err = invoke(monkeypatch, capsys, "trace", question, "--chat", "-t", "0", "--steps", "40", "--json")
    assert code == 0, err
    doc = json.loads(out)
    messages = [{"role": "user", "content": question}]
    ids = list(bundled.tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    assert [t["id"] for t in doc["prompt"]] == ids
    with torch.inference_mode():
        reference = bundled.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=40)[0, len(ids) :]
    chosen = [s["chosen"]["id"] for s in doc["steps"]]
    assert chosen == reference.tolist()  # generate() stops at the end of the turn, and so does the trace
    assert doc["stop_reason"] and "Paris" in doc["text"]


def test_chat_needs_a_template_and_system_needs_chat(monkeypatch, capsys, tiny_dir):
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--chat", "--model", tiny_dir)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "no chat template" in errors[0] and "Traceback" not in err
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--system", "be brief", "--model", tiny_dir)
    assert code == 2 and "--system needs --chat" in err


def test_the_process_exit_code_says_how_the_app_ended(monkeypatch):
    """0 after q, 1 after an error the app did not handle (Textual's return code), 128 + N after
    signal N: a script can tell them apart (it read 0 after a crash before)."""
    from apptools import frozen_snapshot

    from tokenviz.cli.commands import in_terminal
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.recording import RecordingWorker

    codes = []

    def exit_now(code):
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(in_terminal, "exit_now", exit_now)
    endings = [lambda app: None, lambda app: setattr(app, "_return_code", 1), lambda app: setattr(app, "signalled", 15)]
    for ending in endings:
        monkeypatch.setattr(TokenvizApp, "run", lambda self, ending=ending: ending(self))
        with pytest.raises(SystemExit):
            in_terminal.run_app(RecordingWorker(frozen_snapshot()), "tokenviz-dark")
    assert codes == [0, 1, 143]


def test_a_trace_reports_its_steps_as_it_runs(tmp_path):
    """Work longer than a few seconds says how far it is: the trace reports each step it takes (a bar
    on a terminal; a log gets the end of each job only)."""
    from tiny import tiny_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.cli.headless import run_session
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    said = []
    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0, max_new_tokens=4))
    run_session(session, "The cat sat", lambda message, fraction: said.append((message, fraction)))
    stepping = [(m, f) for m, f in said if m.startswith("stepping")]
    assert stepping and stepping[0] == ("stepping: 1 of at most 4 tokens", 0.25)
    assert [f for _, f in stepping] == sorted(f for _, f in stepping)
