"""Hostile command lines: Rich markup in user text, no terminal, invalid UTF-8, settings that would
overflow the distribution, and the table mode of every trace."""

import json
import os
import subprocess
import sys

import pytest
from clitools import invoke
from tiny import save_tiny


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-hostile-cli"), "llama", context=64)


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize(
    "args, shown",
    [
        (["--theme", "[/]"], "unknown theme '[/]'"),
        (["replay", "[/]x.json"], "no such file: [/]x.json"),
        (["trace", "hi", "--model", "[/]nope"], "[/]nope"),
        (["trace", "hi", "--temperature", "1e-38"], "at least 0.001"),
        (["trace", "hi", "--repetition-penalty", "1e-300"], "from 0.01 to 100"),
    ],
)
def test_markup_and_overflowing_settings_get_one_plain_line(monkeypatch, capsys, args, shown):
    code, _, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and shown in one_error(err)


def test_a_prompt_prints_as_typed_in_the_table(monkeypatch, capsys, tiny_dir):
    code, out, err = invoke(monkeypatch, capsys, "trace", "a [/] b [bold]c", "--model", tiny_dir, "--steps", "2")
    assert code == 0, err
    assert "a [/] b [bold]c" in out


@pytest.mark.parametrize("mode", [["--beams", "2"], ["--speculate", "prompt-lookup"]])
def test_the_table_mode_of_beams_and_speculation(monkeypatch, capsys, tiny_dir, mode):
    code, out, err = invoke(monkeypatch, capsys, "trace", "The cat sat", "--model", tiny_dir, "--steps", "3", *mode)
    assert code == 0, err
    assert "output:" in out and "text:" in out


def test_an_invalid_utf8_prompt_gets_one_line(monkeypatch, capsys, tiny_dir):
    prompt = b"abc\xff def".decode("utf-8", "surrogateescape")  # as Python passes such an argument
    code, _, err = invoke(monkeypatch, capsys, "trace", prompt, "--model", tiny_dir, "--steps", "2")
    assert code == 2 and "not valid UTF-8" in one_error(err)


@pytest.mark.parametrize(
    "args, env, headless",
    [
        (["replay", "x.json"], {}, "tokenviz replay FILE --verify"),
        ([], {}, "tokenviz trace PROMPT --json"),
        ([], {"TERM": "dumb"}, "tokenviz trace PROMPT --json"),
    ],
)
def test_the_app_without_a_terminal_refuses_at_once(args, env, headless, tmp_path):
    """Each command names its own form for a script (issue 69, finding 19: compare piped suggested trace)."""
    journey = tmp_path / "x.json"
    if args[:1] == ["replay"]:
        from apptools import frozen_recording

        from tokenviz.files.journey_file import save_journey

        save_journey(journey, *frozen_recording(steps=1))
        args = ["replay", str(journey)]
    out = subprocess.run(
        [sys.executable, "-m", "tokenviz", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert headless in one_error(out.stderr)
    assert out.stdout == ""


def test_compare_without_a_terminal_prints_its_table_whatever_b_is(tiny_dir):
    """UX 7's finding 13: piped, compare refused when B ran here ("needs a terminal") and printed a table when
    B was a server. One behaviour: the table (every step both take, the KL, Δp, the ranks, where the paths
    part and the steps in llama-perplexity's terms), as a served B's."""
    out = subprocess.run(
        [sys.executable, "-m", "tokenviz", "compare", "hi", "--model", tiny_dir, "--steps", "3"]
        + ["--temperature", "0", "--against", "temperature=1.5", "--against", "seed=4"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    shown = " ".join(out.stdout.split())
    for words in ("A chose", "B chose", "KL bits", "Δp", "B's rank of A's", "as llama-perplexity, B the base"):
        assert words in shown, (words, out.stdout)
    assert "request ms" not in shown and "differs: sampling greedy A, T 1.5 B" in shown


def test_json_output_is_strict(monkeypatch, capsys, tiny_dir):
    code, out, _ = invoke(monkeypatch, capsys, "trace", "The cat", "--model", tiny_dir, "--steps", "2", "--json")
    assert code == 0
    json.loads(out, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))


def test_a_model_whose_output_is_not_a_number_is_reported_never_chosen(monkeypatch, capsys, tmp_path):
    """Damaged weights (here every output weight NaN): one line, exit 2, and no token."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = save_tiny(tmp_path / "nan", "llama", context=64)
    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    model.save_pretrained(directory)
    code, out, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", directory, "--steps", "2", "--json")
    assert code == 2 and "not a number" in one_error(err) and out == ""


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["trace", "hi", "--tempreature", "0"],
            "No such option: --tempreature (Possible options: --steer, --temperature)",
        ),
        (["trace"], "Missing argument 'prompt'"),
        (["--bogus"], "No such option: --bogus"),
        (["trace", "hi", "--steps", "x"], "Invalid value for '--steps'"),
    ],
)
def test_a_mistyped_command_line_is_one_line_not_a_box(monkeypatch, capsys, args, said):
    code, out, err = invoke(monkeypatch, capsys, *args)
    line = one_error(err)
    assert code == 2 and said in line and "--help" in line and out == ""
    assert err.strip() == line and "╭" not in err  # (typer's usage box was three lines and a frame)


@pytest.mark.parametrize(
    "args, line",
    [
        (["trace", "x", "--tokenizer", "gpt2"], "--insecure-http and --tokenizer go with --endpoint URL"),
        (["score", "x", "--api-key-env", "K"], "--api-key-file and --insecure-http go with --endpoint URL"),
        (["compare", "x", "--insecure-http"], "draws its own: its options are B's (add --against-backend server)"),
        (["compare", "x", "--against-backend", "server", "--api-key-env", "K"], "go with --endpoint URL"),
        (["serve", "--tokenizer", "gpt2"], "--insecure-http and --tokenizer go with --endpoint URL"),
    ],
)
def test_a_served_option_without_a_server_is_one_line_in_every_command(monkeypatch, capsys, args, line):
    """Each command that takes --endpoint (compare: with --against-backend server) refuses its other served
    options without it, before anything is loaded, rather than ignoring them."""
    code, _, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and line in one_error(err), err


@pytest.mark.parametrize("token", ["id:²", "id:٣", "id:" + "9" * 5000])
def test_a_watched_id_of_digits_int_cannot_read_is_one_line(monkeypatch, capsys, tiny_dir, token):
    """(Round 6, finding 13: str.isdigit takes ², int does not: a ValueError traceback, and in the app
    "internal error".)"""
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", tiny_dir, "--steps", "1", "--watch", token)
    assert code == 2 and "is not a token id: write id: and a number" in one_error(err)
