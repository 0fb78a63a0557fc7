"""Hostile servers and hostile keys, fifth round: what a lying, slow or redirecting server, and a key
that is not one line of text, do to the commands and the bench. Each command runs in this process (where
what a server can make the client hold is under test, in a child process under a time limit and a 6 GB
address-space cap: torch's own mappings take most of it), and must end in one line and exit 2 (never a
traceback, never the token on the screen), or do what the docs say.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import threading
import time

import pytest
from clitools import invoke_with
from hostile_server import MODEL, TOP, completion, hostile_server, silent, slow

from tokenviz.backends.served.engine import MAX_VOCABULARY
from tokenviz.backends.shared import endpoint as endpoint_module
from tokenviz.backends.shared.endpoint import ApiKey, Endpoint, EndpointError, connect
from tokenviz.contract.errors import TokenvizError

pytestmark = pytest.mark.hostile  # (stub servers that stall, lie or flood)

TOKEN = "tv-secret-token-0123456789"
KEY_ENV = "TOKENVIZ_HOSTILE_KEY"
CHILD_LIMIT_S = 60  # a hang guard; the deadlines under test are seconds
ADDRESS_SPACE = 6 << 30  # a bound on what a server can make the client hold (torch's own mappings fit in it)


def run(*args: str, key: str = TOKEN) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tokenviz ARGS` in this process, the key in KEY_ENV."""
    return invoke_with({KEY_ENV: key}, *args)


def run_capped(*args: str, key: str = TOKEN) -> tuple[int, str, str]:
    """As run, in a child under the limits: where what a server can make the client hold is under test."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    done = subprocess.run(
        [sys.executable, "-m", "tokenviz", *args],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=CHILD_LIMIT_S,
        stdin=subprocess.DEVNULL,
        env={**os.environ, KEY_ENV: key},
    )
    return done.returncode, done.stdout, done.stderr


def one_line(code: int, out: str, err: str, key: str = TOKEN) -> str:
    """The one error line of a command that failed as it should: exit 2, no traceback, no token."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err)
    assert key not in out and key not in err
    return errors[0]


def served(server, *args: str) -> list[str]:
    return ["--endpoint", server.url, "--api-key-env", KEY_ENV, *args]


def compared_with(server, model: str) -> list[str]:
    """compare: `model` here (A) beside the model `server` serves (B)."""
    return ["compare", "Hello", "--model", model, "--against-backend", "server", *served(server)]


# ---- the token is never printed --------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [TOKEN + "\r\nX-Evil: 1", TOKEN + "\nX-Evil: 1", TOKEN + "\x1b[2J", TOKEN + "é", TOKEN + "\u0100\u4e2d"],
    ids=["crlf", "lf", "escape", "latin-1", "non-latin-1"],
)
def test_a_key_that_is_not_one_line_of_printable_ascii_is_refused_without_showing_it(key):
    with hostile_server() as server:
        for command in (
            ["trace", "Hello", "--steps", "1"],
            ["score", "Hello there"],
            ["Hello"],
        ):  # (["Hello"]: the app)
            line = one_line(*run(*command, *served(server), key=key), key=TOKEN)
            assert f"--api-key-env {KEY_ENV}" in line and "printable ASCII" in line
        assert server.log.requests == []  # nothing was sent with it


def test_a_key_file_of_several_lines_or_a_directory_is_one_line_and_a_shared_one_warns(tmp_path):
    with hostile_server() as server:
        two = tmp_path / "two-lines"
        two.write_text(f"{TOKEN}\nX-Evil: 1\n")
        two.chmod(0o600)
        nul = tmp_path / "nul"
        nul.write_bytes(TOKEN.encode() + b"\x00X\n")
        nul.chmod(0o600)
        folder = tmp_path / "folder"
        folder.mkdir()
        for path, said in ((two, "one token on one line"), (nul, "printable ASCII"), (folder, "is a directory")):
            code, out, err = run("trace", "Hello", "--endpoint", server.url, "--api-key-file", str(path))
            assert said in one_line(code, out, err)
        shared = tmp_path / "shared"
        shared.write_text(TOKEN + "\n")
        shared.chmod(0o644)
        code, out, err = run("trace", "Hello", "--endpoint", server.url, "--api-key-file", str(shared), "--steps", "1")
        assert code == 0 and f"warning: the API key file {shared} can be read by others: chmod 600 it" in err
        assert TOKEN not in out + err


def test_a_server_that_echoes_the_token_has_it_masked():
    with hostile_server() as server:
        echo = {"error": {"message": f"bad request from Bearer {TOKEN} at /v1/completions"}}
        server.routes["/v1/completions"] = lambda h: h.answer(500, echo)
        line = one_line(*run("trace", "Hello", *served(server)))
        assert "HTTP 500" in line and "<the API key>" in line


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1 x", "http://127.0.0.1:8000/v1\r\nX: 1", "http://é.example/v1"]
)
def test_an_endpoint_with_spaces_or_control_characters_is_one_line(url):
    line = one_line(*run("trace", "Hello", "--endpoint", url, "--api-key-env", KEY_ENV))
    assert "--endpoint" in line


# ---- the token is never forwarded --------------------------------------------------------------------


def test_the_bench_follows_no_redirect_and_sends_no_key_over_plain_http_to_another_host(monkeypatch):
    """The bench's served measure goes through the same client: a 302 to another server is refused
    (the other server sees nothing), and plain http to a host not this machine needs --insecure-http."""
    from bench import served as served_measures

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server, hostile_server() as elsewhere:
        moved = {"Location": elsewhere.url + "/completions"}
        server.routes["/v1/completions"] = lambda h: h.answer(302, b"", moved)
        with pytest.raises(TokenvizError, match="HTTP 302"):  # (the journey's error, as the app shows it)
            served_measures.served(server.url, ApiKey(env=KEY_ENV), tokens=2, rounds=1)
        assert elsewhere.log.requests == []
        assert all(auth == f"Bearer {TOKEN}" for _, auth in server.log.requests)
    with pytest.raises(TokenvizError, match=r"unencrypted to 192\.0\.2\.1"):  # (refused before any connection)
        served_measures.served("http://192.0.2.1:8000/v1", ApiKey(env=KEY_ENV), tokens=2, rounds=1)


def test_a_streamed_line_that_never_ends_is_refused_in_bounded_memory(monkeypatch):
    monkeypatch.setattr(endpoint_module, "MAX_LINE_BYTES", 1 << 16)

    def endless(h) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            for _ in range(10_000):
                h.wfile.write(b"x" * 4096)
        except OSError:
            pass

    with hostile_server() as server:
        server.routes["/v1/completions"] = endless
        endpoint = Endpoint(server.url)
        with pytest.raises(EndpointError, match="streamed a line longer than"):
            list(endpoint.stream_lines("/completions", {}))


# ---- a deadline for every whole request -------------------------------------------------------------------


@pytest.mark.parametrize("headers_first", [True, False], ids=["headers", "body"])
def test_a_slow_loris_is_cut_off_at_the_deadline(monkeypatch, headers_first):
    monkeypatch.setattr(endpoint_module, "METADATA_DEADLINE_S", 1.5)
    with hostile_server() as server:
        server.routes["/v1/models"] = slow(headers_first, every=0.2)
        endpoint = Endpoint(server.url)
        started = time.monotonic()
        with pytest.raises(EndpointError, match=r"did not answer /models within 1.5 s"):
            endpoint.get("/models", deadline=endpoint_module.METADATA_DEADLINE_S)
        assert time.monotonic() - started < 15  # (cut, not read until the server gives up: 2,000 s)


def test_a_kept_alive_connection_closed_as_it_was_reused_is_asked_again_once():
    """vLLM's server (uvicorn) closes a connection idle for 5 s; a request sent on it as it closes gets no
    answer ("Server disconnected without sending a response": a served test at 200x60 saw "the server ...
    stopped answering" so, under load). It is sent again once, on a new connection; a server that hangs
    up on every try is still one line."""
    from hostile_server import hang_up

    with hostile_server() as server:
        tries: list[int] = []

        def once_closed(h) -> None:
            tries.append(1)
            if len(tries) == 1:
                hang_up(h)
            else:
                h.answer(200, {"data": [{"id": MODEL}]})

        server.routes["/v1/models"] = once_closed
        endpoint = Endpoint(server.url)
        assert endpoint.get("/models")["data"][0]["id"] == MODEL and len(tries) == 2
        server.routes["/v1/models"] = hang_up
        with pytest.raises(EndpointError, match=r"stopped answering|cannot reach") as raised:
            endpoint.get("/models")
        assert "\n" not in str(raised.value) and server.log.paths("/v1/models") == 4, server.log.requests


def test_a_server_that_never_answers_is_one_line_at_the_metadata_deadline():
    with hostile_server() as server:
        server.routes["/v1/models"] = silent
        line = one_line(*run("trace", "Hello", *served(server)))
        assert f"did not answer /models within {endpoint_module.METADATA_DEADLINE_S:g} s" in line


# ---- a server's numbers checked before they are used ---------------------------------------------------


def top_with(**changes) -> list[tuple[int, float]]:
    return [(i, changes.get(f"t{i}", lp)) for i, lp in TOP[:20]]


@pytest.mark.parametrize(
    "route, said",
    [
        (completion(top_with(t0=800.0)), "log-probability of 800"),
        (completion(chosen_logprob=800.0), "log-probability of 800"),
        (completion(chosen_logprob=1.5), "log-probability of 1.5"),
        (completion(chosen_logprob=b"1e400"), "the number 1e400 is past a float's range"),
        (completion(top_with(t3="-0.5")), "not a number"),
    ],
    ids=["top-800", "chosen-800", "above-0", "1e400", "a-string"],
)
def test_a_log_probability_no_distribution_holds_is_one_line(route, said):
    with hostile_server() as server:
        server.routes["/v1/completions"] = route
        for command in (["trace", "Hello", "--steps", "2"], ["trace", "Hello", "--json", "--temperature", "0"]):
            assert said in one_line(*run(*command, *served(server)))


def test_a_rank_past_any_vocabulary_is_one_line_in_score():
    def rank(h) -> None:
        asked = h.body()
        entries = [None] + [{str(t): {"logprob": -1.0, "rank": "__RAW__"}} for t in asked["prompt"][1:]]
        text = json.dumps({"choices": [{"text": "", "prompt_logprobs": entries, "logprobs": None}]})
        h.answer(200, text.replace('"__RAW__"', "1e400").encode())  # (JSON's number, past a float)

    with hostile_server() as server:
        server.routes["/v1/completions"] = rank
        assert "the number 1e400 is past a float's range" in one_line(*run("score", "Hello there", *served(server)))


def test_a_top_list_past_what_the_request_asks_is_refused_unread():
    """(Round 6, finding 9: a top list of 10^6 entries, 31 MB, was parsed and sorted whole: 108-150 s for a
    one-step trace.) The answer is read no further than its request can need (the top 20 asked)."""
    many = [(i, -20.0 - i * 1e-6) for i in range(1_000_000)]
    with hostile_server() as server:
        server.routes["/v1/completions"] = completion(many)
        line = one_line(*run_capped("trace", "Hello", *served(server), "--steps", "2", "--json"))
        assert "answered /completions with more than the" in line and "the request can need: refused" in line
        assert server.log.paths("/detokenize") <= 2 * MAX_VOCABULARY.bit_length()  # (no id of the list looked up)


def test_a_top_list_a_little_longer_than_asked_is_cut_to_the_n_asked():
    """A server may send a few more than asked (vLLM adds the chosen token past the top N): cut, not refused."""
    with hostile_server() as server:
        server.routes["/v1/completions"] = completion([(i, -3.0 - i * 1e-3) for i in range(40)])
        code, out, err = run("trace", "Hello", *served(server), "--steps", "2", "--json")
        assert code == 0, err
        assert all(len(step["top"]) <= 21 for step in json.loads(out)["steps"])


def test_tokenize_answering_booleans_is_one_line():
    with hostile_server() as server:
        server.routes["/tokenize"] = lambda h: h.answer(200, {"tokens": [True, False, True]})
        assert "did not answer with token ids" in one_line(*run("trace", "Hello", *served(server)))


def test_bidirectional_controls_in_a_token_are_written_out():
    with hostile_server() as server:
        server.routes["/detokenize"] = lambda h: h.answer(200, {"prompt": "a\u202eevil\u2066b"})
        code, out, err = run("trace", "Hello", *served(server), "--steps", "1")
        assert code == 0, err
        assert "\u202e" not in out and "\u2066" not in out and "<0x202E>" in out


def test_compare_against_a_server_whose_ids_pass_the_local_vocabulary_is_one_line(tmp_path):
    from tiny import save_tiny
    from transformers import AutoTokenizer

    model = save_tiny(tmp_path / "tiny", "llama", context=64)
    ids = AutoTokenizer.from_pretrained(model)("Hello", add_special_tokens=True)["input_ids"]
    with hostile_server() as server:
        server.routes["/tokenize"] = lambda h: h.answer(200, {"tokens": ids})
        server.routes["/v1/completions"] = completion([(10**6 + i, lp) for i, lp in TOP[:20]], chosen=10**6)
        command = compared_with(server, model)
        line = one_line(*run(*command, "--steps", "2"))
        assert "past" in line and "vocabulary" in line and "compare needs one tokenizer" in line


def test_connect_names_the_model_it_serves(monkeypatch):
    """(The hostile server answers as a tiny vLLM would, where no test scripts it otherwise.)"""
    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        endpoint = connect(server.url, ApiKey(env=KEY_ENV))
        assert endpoint.get("/models")["data"][0]["id"] == MODEL
        assert server.log.requests == [("/v1/models", f"Bearer {TOKEN}")]


def served_app(server, settings):
    """The app on the hostile server's model, the prompt "Hi", the key in KEY_ENV."""
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    choice = ServedChoice(server.url, api_key=ApiKey(env=KEY_ENV))
    return TokenvizApp(EngineWorker(lambda progress: ServedEngine.open(choice, progress=progress), settings, "Hi"))


# ---- a server that dies mid-journey ------------------------------------------------------------------------


async def test_a_server_dying_during_autoplay_is_said_and_autoplay_stops_with_the_journey_kept(monkeypatch):
    from apptools import settle, wait_for
    from hostile_server import hang_up

    from tokenviz.contract.settings import SamplingSettings

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        app = served_app(server, SamplingSettings(temperature=0, max_new_tokens=10_000))
        async with app.run_test(size=(120, 36)) as pilot:
            s = await settle(app, pilot)
            assert s.error is None
            await pilot.press("a")
            await wait_for(lambda: app.journey.snapshot.playing and len(app.journey.snapshot.chips) > 6, pilot)
            for path in ("/v1/completions", "/detokenize", "/tokenize", "/v1/models"):
                server.routes[path] = hang_up
            await wait_for(lambda: app.journey.snapshot.error is not None, pilot, timeout=30)
            s = app.journey.snapshot
            assert "stopped answering" in s.error and "internal error" not in s.error, s.error
            assert not s.playing and s.state != "playing" and len(s.chips) > 6  # the journey is kept
            assert TOKEN not in s.error


# ---- replay --verify of a served journey ----------------------------------------------------------------


async def test_replay_verify_of_a_served_journey_asks_the_server_and_checks_its_log_probabilities(
    monkeypatch, tmp_path
):
    """Without --endpoint: one line saying it needs one (not a load of the server's model name). With
    it: verified while the server answers as recorded; a server whose log-probabilities moved, same
    tokens, is a mismatch (exit 1)."""
    from apptools import settle, wait_for

    from tokenviz.contract.settings import SamplingSettings

    monkeypatch.setenv(KEY_ENV, TOKEN)
    monkeypatch.chdir(tmp_path)
    with hostile_server() as server:
        app = served_app(server, SamplingSettings(temperature=0))
        async with app.run_test(size=(120, 36)) as pilot:
            await settle(app, pilot)
            for key in ("space", "space", "x"):
                await pilot.press(key)
                await settle(app, pilot)
            await wait_for(lambda: len(list(tmp_path.glob("tokenviz-*.json"))) == 1, pilot, timeout=30)
        saved = str(next(tmp_path.glob("tokenviz-*.json")))
        line = one_line(*run("replay", saved, "--verify"))
        assert "--endpoint" in line and MODEL in line
        code, out, err = run("replay", saved, "--verify", *served(server))
        assert code == 0 and "verified: all 2 steps" in out, err
        server.routes["/v1/completions"] = completion([(0, -1.2), *TOP[1:20]])  # the same token, p 0.30 not 0.40
        code, out, err = run("replay", saved, "--verify", *served(server))
        assert code == 1 and "mismatch: step 0" in err and "log-probability" in err, (out, err)
        assert TOKEN not in out + err


def test_a_server_that_refuses_the_internals_probe_opens_without_them_and_says_why():
    """A server that is not vLLM may refuse a request's extra fields (vllm_xargs): the engine opens on
    the journey alone, its lens and attention refused in one line naming the plugin."""
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.contract.engine import Capability, refusal_of

    plain = completion()

    def strict(h):
        if "vllm_xargs" in h.body():
            h.answer(400, {"error": {"message": "extra fields not permitted"}})
        else:
            plain(h)

    with hostile_server() as server:
        server.routes["/v1/completions"] = strict
        engine = ServedEngine(Endpoint(server.url, None), MODEL)
        assert engine.internals is None and Capability.LENS.value not in engine.info.capabilities
        line = refusal_of(engine.info, Capability.LENS, "the logit lens")
        assert line is not None and "no vllm-lens plugin" in line and "pip install" in line


# ---- sixth round ------------------------------------------------------------------------------------------

HUGE = "9" * 401  # a JSON integer Python holds exactly and no float does


def raw_answer(text: str):
    """A route answering `text` as it is (JSON a test writes by hand: numbers json.dumps cannot)."""
    return lambda h: h.answer(200, text.encode())


@pytest.mark.parametrize(
    "text",
    [
        '{"choices": [{"logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-%s], "top_logprobs": [{}]}}]}',
        '{"choices": [{"logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-1.0], '
        '"top_logprobs": [{"token_id:1": -%s}]}}]}',
        '{"activations": {"qk_meta": {"__json__": [{"scale": %s}]}}, "choices": []}',
    ],
    ids=["logprob", "top-logprob", "qk-scale"],
)
def test_a_401_digit_integer_anywhere_in_an_answer_is_one_line(text):
    """(Finding 3: an OverflowError traceback, exit 1; the app's attention pane waited for ever.)"""
    with hostile_server() as server:
        server.routes["/v1/completions"] = raw_answer(text % HUGE)
        with pytest.raises(EndpointError, match="an integer of 401 digits is past any count or id"):
            Endpoint(server.url).post("/completions", {})
        if "qk" not in text:
            line = one_line(*run("trace", "Hello", *served(server), "--steps", "1"))
            assert "401 digits" in line


def test_score_with_a_prompt_log_probability_past_a_float_is_one_line():
    """(Finding 10: -1e400 gave a total of -inf and a perplexity of inf, exit 0.)"""

    def prompt_logprobs(h) -> None:
        asked = h.body()
        entries = [None] + [{str(t): {"logprob": "__RAW__", "rank": 1}} for t in asked["prompt"][1:]]
        text = json.dumps({"choices": [{"text": "", "prompt_logprobs": entries, "logprobs": None}]})
        h.answer(200, text.replace('"__RAW__"', "-1e400").encode())

    with hostile_server() as server:
        server.routes["/v1/completions"] = prompt_logprobs
        assert "the number -1e400 is past a float's range" in one_line(*run("score", "Hello there", *served(server)))


def test_a_context_claimed_as_a_boolean_is_not_taken_for_one():
    """(Finding 11: `max_model_len: true` read as a context of 1: "reads at most True".)"""
    from tokenviz.backends.served.engine import MAX_CONTEXT, ServedEngine

    with hostile_server() as server:
        server.routes["/v1/models"] = lambda h: h.answer(200, {"data": [{"id": MODEL, "max_model_len": True}]})
        assert ServedEngine(Endpoint(server.url, None), MODEL).info.context == MAX_CONTEXT
        code, out, err = run("trace", "Hello", *served(server), "--steps", "1")
        assert code == 0 and "True" not in out + err, err


def test_a_server_listing_the_key_as_its_model_never_shows_or_saves_it(tmp_path):
    """(Finding 12: the key shown unmasked, and written four times each into --save, --html and --json.)"""
    with hostile_server() as server:
        server.routes["/v1/models"] = lambda h: h.answer(200, {"data": [{"id": TOKEN}]})
        saved, page = tmp_path / "journey.json", tmp_path / "journey.html"
        code, out, err = run(
            "trace", "Hello", *served(server), "--steps", "2", "--json", "--save", str(saved), "--html", str(page)
        )
        assert code == 0, err
        written = saved.read_text() + page.read_text()
        assert TOKEN not in out + err + written and endpoint_module.MASK in json.loads(out)["model"]["name"]
        code, out, err = run("trace", "Hello", *served(server), "--served-model", "other")
        assert TOKEN not in out + err and endpoint_module.MASK in one_line(code, out, err)
        # (the requests still name the model as the server does: the key only in what is shown)
        assert server.log.paths("/v1/completions") >= 2


def test_a_vocabulary_that_differs_is_listed_among_the_comparisons_differences(tmp_path):
    """(Finding 14: a server claiming 4,194,304 tokens against the local 49,152 gave exit 0 and no word.)"""
    from tiny import save_tiny
    from transformers import AutoTokenizer

    model = save_tiny(tmp_path / "tiny", "llama", context=64)
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer("Hello", add_special_tokens=True)["input_ids"]
    vocab = len(tokenizer)
    with hostile_server() as server:
        server.routes["/tokenize"] = lambda h: h.answer(200, {"tokens": ids})
        server.routes["/detokenize"] = lambda h: h.answer(
            200, {"prompt": "x" if max(h.body().get("tokens", [0])) < 4_194_304 else ""}
        )
        server.routes["/v1/completions"] = completion([(i % vocab, lp) for i, lp in TOP[:20]])
        command = compared_with(server, model)
        code, out, err = run(*command, "--steps", "2", "--json")
        assert code == 0, err
        assert json.loads(out)["differences"]["vocabulary"] == [f"{vocab:,}", "4,194,304"]
        code, out, err = run(*command, "--steps", "2")
        assert code == 0 and f"vocabulary {vocab:,} here, 4,194,304 on the server" in " ".join(out.split()), out


def test_a_steering_scale_that_overflows_is_refused_before_any_request():
    """(Finding 4: 1e39 gave a numpy warning, then an all-inf steering vector was sent to the server.)"""
    with hostile_server() as server:
        line = one_line(*run("trace", "Hello", *served(server), "--steer-tokens", "15:1e39: Paris: the"))
        assert "a steering scale is at most ±3.4e+38, float32's range (got 1e+39)" in line
        assert server.log.paths("/v1/completions") == 0


def test_the_bench_against_an_endless_stream_is_one_line(tmp_path):
    """(Finding 15: an endless server-sent stream ran 154 s, then an EndpointError traceback.)"""

    def endless(h) -> None:
        if not h.body().get("stream"):
            completion()(h)
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        event = b'data: {"choices": [{"logprobs": {"tokens": ["token_id:1"]}}]}\n\n'
        try:
            for _ in range(100_000):
                h.wfile.write(event)
                h.wfile.flush()
        except OSError:
            pass  # (the client hung up: what it should do)

    with hostile_server() as server:
        server.routes["/v1/completions"] = endless
        done = subprocess.run(
            [sys.executable, "-m", "bench", "--quick", "--only", "served", "--endpoint", server.url]
            + ["--api-key-env", KEY_ENV, "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=CHILD_LIMIT_S * 4,
            stdin=subprocess.DEVNULL,
            env={**os.environ, KEY_ENV: TOKEN},
        )
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        port = server.server_address[1]
        said = rf"error: served: 127\.0\.0\.1:{port} streamed more than the \d+ tokens asked: refused"
        assert len(errors) == 1 and re.fullmatch(said, errors[0]), errors


@pytest.mark.parametrize("path", ["/v1/completions", "/detokenize", "/version"])
def test_a_route_that_never_answers_while_connecting_is_one_line_at_one_deadline(monkeypatch, path):
    """(Finding 7: a silent /v1/completions gave 252 s of silence, the probe's deadline swallowed and the
    request made again; a silent /detokenize 344 s, each 8 s deadline swallowed by the vocabulary's
    search.) A silent route is no answer, never a server lacking something: one line naming it, within
    one deadline for the whole connection."""
    from tokenviz.backends.served import engine as engine_module
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.shared.endpoint import NoAnswer

    monkeypatch.setattr(endpoint_module, "METADATA_DEADLINE_S", 1.0)
    monkeypatch.setattr(endpoint_module, "REQUEST_DEADLINE_S", 2.0)
    monkeypatch.setattr(engine_module, "CONNECT_PHASE_S", 4.0)
    with hostile_server() as server:
        server.routes[path] = silent
        started = time.monotonic()
        with pytest.raises(NoAnswer) as caught:
            ServedEngine(Endpoint(server.url, None), MODEL)
        waited = time.monotonic() - started
    route = path.removeprefix("/v1")
    assert f"did not answer {route} within" in str(caught.value) or f"route it was asked: {route}" in str(caught.value)
    assert waited < 30, waited  # (the deadline under test; before: one swallowed per id asked, or two in turn)
    assert sum(1 for p, _ in server.log.requests if p == path) <= 2


# ---- replay --verify checks everything a journey shows (round 6, finding 1) ---------------------------------


def tamper_chip(doc) -> None:  # a generated chip's id (replay shows its text; the next step's context)
    doc["replay"]["chips"][-1][0] = (doc["replay"]["chips"][-1][0] + 7) % 100


def tamper_text(doc) -> None:
    doc["text"] = " Rome, Italy"


def tamper_top(doc) -> None:  # a top-20 log-probability 0.5 off
    doc["replay"]["records"][1]["top"][2][2] -= 0.5


def tamper_model(doc) -> None:
    doc["model"]["name"] = doc["replay"]["info"]["name"] = "gpt-4"
    doc["model"]["device"] = doc["replay"]["info"]["device"] = "served at api.openai.com"


def tamper_settings(doc) -> None:  # a setting that changes the step (a file holds each step's settings once)
    doc["replay"]["records"][0]["decision"]["settings"]["repetition_penalty"] = 1.3


def tamper_top_settings(doc) -> None:  # the settings the journey ends under, and nothing else
    doc["settings"]["temperature"] = 0.5


def tamper_piece(doc) -> None:  # a piece of text derived from an id
    doc["replay"]["records"][1]["top"][0][1] = " Paris"


def tamper_diagnosis(doc) -> None:  # the why view's finding, which is read off the measured steps
    doc["diagnosis"] = [*doc.get("diagnosis", []), {"symptom": "repetition", "cause": "a lie"}]


TAMPERED = [
    (tamper_diagnosis, "diagnosis holds"),
    (tamper_chip, "replay.chips["),
    (tamper_text, "text is ' Rome, Italy' in the journey"),
    (tamper_top, "replay.records[1].top[2][2]"),
    (tamper_model, "model.name is 'gpt-4' in the journey"),
    (tamper_settings, "mismatch: replay.records[0].decision."),
    (tamper_top_settings, "settings.temperature is 0.5"),
    (tamper_piece, "replay.records[1].top[0][1] is ' Paris'"),
]


def test_replay_verify_of_a_tampered_served_journey_names_what_differs(monkeypatch, capsys, tmp_path):
    """(Finding 1: each of these was "verified", exit 0: only the chosen ids and their probability were
    read.) The journey as saved verifies; each change alone is a mismatch naming its place."""
    from clitools import invoke

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        saved = tmp_path / "served.json"
        trace = ["trace", "Hello", *served(server), "--steps", "3", "--temperature", "0", "--save", str(saved)]
        code, _, err = invoke(monkeypatch, capsys, *trace)
        assert code == 0, err
        code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *served(server))
        assert code == 0 and "verified: all 3 steps" in out, err
        original = saved.read_text()
        for tamper, said in TAMPERED:
            doc = json.loads(original)
            tamper(doc)
            saved.write_text(json.dumps(doc))
            code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *served(server))
            assert code == 1 and said in err and "mismatch" in err, (tamper.__name__, code, out, err)
            assert TOKEN not in out + err
        doc = json.loads(original)  # another branch: its summary is kept, its steps are not, and the verdict says so
        branch = {"index": 0, "text": " Rome", "tokens": 1, "logprob": -1.0, "mean_entropy": 1.0, "shared": 2}
        doc["replay"]["branches"].append({**branch, "current": False})
        saved.write_text(json.dumps(doc))
        code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *served(server))
        assert code == 0 and "(not its 1 other branch: a file keeps their summaries, not their steps)" in out, err


def test_a_served_journey_with_a_log_probability_above_0_is_refused_by_the_schema(monkeypatch, capsys, tmp_path):
    from clitools import invoke

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        saved = tmp_path / "served.json"
        code, _, err = invoke(
            monkeypatch, capsys, "trace", "Hello", *served(server), "--steps", "2", "--save", str(saved)
        )
        assert code == 0, err
    doc = json.loads(saved.read_text())
    doc["replay"]["records"][0]["top"][0][2] = 800.0
    saved.write_text(json.dumps(doc))
    code, _, err = invoke(monkeypatch, capsys, "replay", str(saved))
    assert code == 2 and "damaged at replay" in err and "log-probability of 800, above 0" in err, err


async def test_a_busy_server_retried_is_said_in_the_status_line_the_way_the_loader_was_told(monkeypatch):
    """A served engine speaks one way: what its loader was told (Endpoint.tell), kept for its life; the app's
    worker shows a line said after loading in the status line (no attribute the worker sets on the engine)."""
    from apptools import settle, wait_for

    from tokenviz.contract.settings import SamplingSettings

    plain, busy = completion(), []

    def busy_once(h) -> None:
        if not busy:
            busy.append(True)
            h.answer(503, {"error": {"message": "busy"}})
        else:
            plain(h)

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        app = served_app(server, SamplingSettings(temperature=0, max_new_tokens=100))
        async with app.run_test(size=(120, 36)) as pilot:
            await settle(app, pilot)
            worker, said = app.journey.worker, []
            post = worker._post
            worker._post = lambda snapshot: (said.append(snapshot.message), post(snapshot))
            server.routes["/v1/completions"] = busy_once
            steps = len(app.journey.snapshot.chips)
            await pilot.press("space")
            await wait_for(lambda: len(app.journey.snapshot.chips) > steps, pilot, timeout=60)
            host = f"127.0.0.1:{server.server_address[1]}"
            assert f"{host} is busy (HTTP 503): trying again in 0.5 s (1)" in said, said


async def test_a_request_past_a_second_says_in_the_status_line_what_it_waits_on(monkeypatch):
    """(Finding 7: silent waits; the status line said nothing while a request had not answered.)"""
    from apptools import settle, wait_for

    from tokenviz.contract.settings import SamplingSettings

    plain, answer = completion(), threading.Event()

    def slow_answer(h) -> None:  # (held until the test has seen the wait said)
        answer.wait(60)
        plain(h)

    monkeypatch.setenv(KEY_ENV, TOKEN)
    with hostile_server() as server:
        app = served_app(server, SamplingSettings(temperature=0, max_new_tokens=100))
        async with app.run_test(size=(120, 36)) as pilot:
            await settle(app, pilot)
            server.routes["/v1/completions"] = slow_answer
            steps = len(app.journey.snapshot.chips)
            await pilot.press("space")
            said = f"waiting on 127.0.0.1:{server.server_address[1]}: /completions has not answered for"
            await wait_for(lambda: said in app.journey.snapshot.message, pilot, timeout=30)
            answer.set()
            await wait_for(lambda: len(app.journey.snapshot.chips) > steps, pilot, timeout=60)
            assert said not in app.journey.snapshot.message  # (the step's own frame replaced it)
