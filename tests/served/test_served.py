"""A journey on the model a real vLLM server runs (tests/served/conftest.py), held to the same model
run here: its tokens equal, its log-probabilities within SERVED_TOLERANCE; the API key used and never
shown; every fault one line."""

from __future__ import annotations

import json
import math
import os
import socket
import time

import pytest
from clitools import invoke

from tokenviz.files.journey_file import load_journey, trace_document_of

pytestmark = pytest.mark.served

PROMPT = "The Eiffel Tower is located in"
# vLLM's float32 CPU kernels against transformers' float32 sdpa here: the largest difference seen over
# every top-20 candidate of 8 greedy steps was 3.9e-05 nats; the bound leaves room for other builds.
SERVED_TOLERANCE = 1e-3
KEY_ENV = "TOKENVIZ_TEST_SERVER_KEY"


@pytest.fixture
def served(vllm_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    return ["--endpoint", vllm_server.url, "--api-key-env", KEY_ENV]


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def trace_json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--json", *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.bundled
def test_the_served_journey_is_the_local_one(monkeypatch, capsys, served, vllm_server):
    """Greedy: the same tokens as the bundled model run here in float32, and every top-20 log-probability
    the server returned within SERVED_TOLERANCE of the local one; the server's distribution measured raw."""
    served_doc = trace_json(monkeypatch, capsys, *served, "--steps", "8", "--temperature", "0")
    local = trace_json(
        monkeypatch, capsys, "--steps", "8", "--temperature", "0", "--dtype", "float32", "--device", "cpu"
    )
    assert [s["chosen"]["id"] for s in served_doc["steps"]] == [s["chosen"]["id"] for s in local["steps"]]
    assert served_doc["text"] == " the Champ de la Corée, a" and served_doc["prompt"] == local["prompt"]
    assert "top 20 log-probabilities, before the sampling settings (raw)" in served_doc["model"]["distribution"]
    for mine, theirs in zip(local["steps"], served_doc["steps"]):
        own = {t["id"]: math.log(t["prob"]) for t in mine["top"]}
        shared = [t for t in theirs["top"] if t["id"] in own]
        assert len(shared) >= 15 and theirs["draw"]["raw_rank"] == 1
        assert theirs.keys() == mine.keys() and theirs["top"][0].keys() == mine["top"][0].keys()  # (one shape)
        for t in shared:
            assert abs(t["logprob"] - own[t["id"]]) < SERVED_TOLERANCE, (t, own[t["id"]])
    assert vllm_server.key not in json.dumps(served_doc)


def test_seeded_sampling_reproduces_and_the_table_names_what_it_shows(monkeypatch, capsys, served):
    runs = [
        trace_json(monkeypatch, capsys, *served, "--steps", "6", "--temperature", "1.0", "--seed", "7")
        for _ in range(2)
    ]
    assert [s["chosen"]["id"] for s in runs[0]["steps"]] == [s["chosen"]["id"] for s in runs[1]["steps"]]
    for step in runs[0]["steps"]:  # the rank from the top-N, or, past it, from the server's prompt_logprobs
        top = [t["id"] for t in step["top"]]
        chosen, rank = step["chosen"]["id"], step["draw"]["raw_rank"]
        assert rank == top.index(chosen) + 1 if chosen in top else rank > len(top)
        assert step["ms"]["request"] > 0
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *served, "--steps", "2", "--temperature", "0")
    assert code == 0, err
    shown = " ".join(out.split())
    assert "served at 127.0.0.1" in shown and "top 20 log-probabilities, before" in shown and "request ms" in shown


def test_a_key_file_works_and_a_wrong_or_missing_key_is_one_line_never_echoed(
    monkeypatch, capsys, vllm_server, tmp_path
):
    key_file = tmp_path / "key"
    key_file.write_text(vllm_server.key + "\n")
    doc = trace_json(
        monkeypatch, capsys, "--endpoint", vllm_server.url, "--api-key-file", str(key_file), "--steps", "1"
    )
    assert len(doc["steps"]) == 1
    wrong = "not-the-key-" + "x" * 12
    monkeypatch.setenv(KEY_ENV, wrong)
    for key_args in (["--api-key-env", KEY_ENV], []):
        code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--endpoint", vllm_server.url, *key_args)
        assert code == 2 and "refused the API key (HTTP 401)" in one_error(err) and out == ""
        assert wrong not in err and vllm_server.key not in err
    os.mkfifo(tmp_path / "pipe")
    code, _, err = invoke(
        monkeypatch, capsys, "trace", PROMPT, "--endpoint", vllm_server.url, "--api-key-file", str(tmp_path / "pipe")
    )
    assert code == 2 and "not a regular file" in one_error(err)


def test_the_servers_key_is_in_no_argument_list_of_its_processes(vllm_server):
    """(Round 6, finding 8: start_vllm passed --api-key KEY, which any local user reads in
    /proc/PID/cmdline; with vllm-lens that key runs code on the server.) The server and every worker of
    its session are searched; the key still works (the test above: a wrong one is refused)."""
    session = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == vllm_server.pid:
                    session.append(int(entry))
            except OSError:
                continue  # (it ended meanwhile)
    assert vllm_server.pid in session
    for pid in session:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                arguments = cmdline.read()
        except OSError:
            continue
        assert vllm_server.key.encode() not in arguments and b"--api-key" not in arguments, pid


def test_an_unknown_model_lists_the_served_ones(monkeypatch, capsys, served):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, *served, "--served-model", "llama-70b")
    assert code == 2 and "does not serve 'llama-70b'; it serves smollm2" in one_error(err)


def test_what_a_served_model_does_not_expose_is_one_line(monkeypatch, capsys, served):
    for option, needs in (
        (["--routing"], "routing: on a served model, a server does not expose it (it needs the model in this process)"),
        (["--beams", "2"], "kv cache: a server keeps its own KV cache: tokenviz cannot read it"),
        (["--speculate", "prompt-lookup"], "kv cache: a server keeps its own KV cache"),
    ):
        code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, *served, *option)
        line = one_error(err)  # (the engine's capabilities asked, as the app's keys ask them, in its backend's words)
        assert code == 2 and f"{option[0]} needs the engine's {needs}" in line, line
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, *served, "--ablate", "1.0")
    assert code == 2 and "cannot be ablated: it needs a hook inside the server's attention" in one_error(err)


def test_a_served_trace_saves_its_journey_and_page_watching_a_token_with_no_trace_of_the_key(
    monkeypatch, capsys, served, vllm_server, tmp_path
):
    """--save, --html and --watch run the app's path (the same Session and served engine) headless."""
    journey, page = tmp_path / "served.json", tmp_path / "served.html"
    options = ["--steps", "3", "--temperature", "0", "--save", str(journey), "--html", str(page), "--watch", " Paris"]
    doc = trace_json(monkeypatch, capsys, *served, *options)
    assert len(doc["steps"]) == 3 and all("watch" in step for step in doc["steps"])
    assert journey.is_file() and page.is_file()
    saved = trace_document_of(*load_journey(journey))  # the file's steps, as replay --json prints them
    for step in (*doc["steps"], *saved["steps"]):  # one shape: what the server cannot give is null, and said so
        assert all(c["logprob"] is not None and c["logit"] is None for c in step["top"]), step["top"][0]
        assert step["entropy_floor"] is not None and step["entropy"] is None and step["kv"] is None
        assert step["ms"]["request"] > 0 and step["ms"]["forward"] is None
    assert {"top.logit", "entropy", "ms.forward", "kv"} == doc["not_given"].keys() == saved["not_given"].keys()
    for written in (journey, page):
        assert vllm_server.key not in written.read_text()
    code, out, err = invoke(monkeypatch, capsys, "replay", str(journey), "--verify", *served)
    assert code == 0, out + err  # (the saved journey, stepped again on the server, token for token)


def test_an_unreachable_server_is_one_line_within_seconds(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed when the block ends: nothing listens there)
    started = time.monotonic()
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--endpoint", f"http://127.0.0.1:{port}/v1")
    assert code == 2 and "cannot reach the server at 127.0.0.1" in one_error(err)
    assert time.monotonic() - started < 30


def test_a_key_is_not_sent_over_plain_http_to_another_machine(monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, "secret")
    code, _, err = invoke(
        monkeypatch, capsys, "trace", PROMPT, "--endpoint", "http://192.0.2.1:8000/v1", "--api-key-env", KEY_ENV
    )
    assert code == 2 and "would travel unencrypted to 192.0.2.1" in one_error(err) and "secret" not in err
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--endpoint", "ftp://x", "--api-key-env", KEY_ENV)
    assert code == 2 and "must be an http:// or https:// URL" in one_error(err)


@pytest.mark.bundled
def test_score_on_the_server_is_the_local_score(monkeypatch, capsys, served):
    """The server's prompt log-probabilities score a text as the bundled model here does: each token's
    log-probability within SERVED_TOLERANCE, the same ranks (" E" 730, as the server itself says)."""
    text = "The Eiffel Tower is located in Paris"

    def scored(*args: str) -> dict:
        code, out, err = invoke(monkeypatch, capsys, "score", text, "--json", *args)
        assert code == 0, err
        return json.loads(out)

    remote, local = scored(*served), scored("--dtype", "float32", "--device", "cpu")
    assert [(t["id"], t["rank"]) for t in remote["tokens"]] == [(t["id"], t["rank"]) for t in local["tokens"]]
    assert remote["tokens"][0]["rank"] == 730 and remote["model"]["covers"] == 20
    for mine, theirs in zip(local["tokens"], remote["tokens"]):
        assert abs(mine["logprob"] - theirs["logprob"]) < SERVED_TOLERANCE
        assert theirs["entropy"] is None and theirs["entropy_floor"] <= mine["entropy"] + 1e-3  # (a floor: top-N)
        assert mine["entropy_floor"] == mine["entropy"]  # (the whole vocabulary's: exact)
    assert abs(remote["perplexity"] - local["perplexity"]) < 0.01 * local["perplexity"]
    code, out, err = invoke(monkeypatch, capsys, "score", text, *served)
    assert code == 0 and "the entropy is a floor" in " ".join(out.split()) and "≥ " in out, err


def test_the_bench_measures_a_served_journey(vllm_server, monkeypatch):
    """The bench's served measure steps the app's own path (the engine thread, a Step and the frame that
    shows it) against the server and reports its figures (no time asserted)."""
    from bench import budgets
    from bench import served as served_measures
    from tokenviz.backends.shared.endpoint import ApiKey

    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    result = served_measures.served(vllm_server.url, ApiKey(env=KEY_ENV), tokens=4, rounds=1)
    assert result["same_tokens"]  # the stepped journey's tokens are the server's own generation's
    assert result["step_ms"] > 0 and result["bare_request_ms"] > 0 and result["streamed_ms_per_token"] > 0
    assert result["ratio"] > 0 and budgets.verdicts({"served": result})["served_step"]["value"] == result["ratio"]


@pytest.mark.bundled
def test_compare_against_the_endpoint_finds_the_same_model_and_sees_a_dtype(monkeypatch, capsys, served):
    """The bundled model here in float32 beside the server's float32 copy: the paths never part, every
    KL over the server's top 20 is next to nothing, each side ranks the other's choice first. In
    bfloat16 here, the KL shows the dtype."""
    endpoint = ["--against-backend", "server", *served]

    def compared(dtype: str) -> dict:
        code, out, err = invoke(monkeypatch, capsys, "compare", PROMPT, *endpoint, "--steps", "6", "--temperature",
                                "0", "--dtype", dtype, "--json")  # fmt: skip
        assert code == 0, err
        return json.loads(out)

    same = compared("float32")
    assert same["parted_at"] is None and len(same["diff"]) == 6 and not same["independent_draws"]
    assert all(s["kl"] < 1e-4 and s["a_rank_of_b"] == s["b_rank_of_a"] == 1 and s["top1_agree"] for s in same["diff"])
    a = same["a"]  # A's journey as trace --json gives it
    assert a["full_text"] == PROMPT + " the Champ de la Corée" and len(a["steps"]) == 6 and "prompt" in a
    other = compared("bfloat16")
    assert max(s["kl"] for s in other["diff"]) > 10 * max(s["kl"] for s in same["diff"])
    code, out, err = invoke(monkeypatch, capsys, "compare", PROMPT, *endpoint, "--steps", "6", "--seed", "3",
                            "--temperature", "1.5", "--top-p", "1.0", "--top-k", "0")  # fmt: skip
    shown = " ".join(out.split())
    assert code == 0 and "two independent draws" in shown, err  # (at T 1.5 over 6 steps the draws part)
