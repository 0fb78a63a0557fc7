"""The journey and the app on the model a real vLLM server runs (tests/served/conftest.py), through the
engine protocol (tokenviz.backends.served): the same Session as a local model, a request per step,
the settings sent as its fields, the server's draw; every number the server's, within SERVED_TOLERANCE
of the bundled model run here; what a served model does not expose, one line."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import sys

import pytest
from apptools import settle, wait_for
from browser import chromium, needs_browser, until
from test_served import KEY_ENV, PROMPT, SERVED_TOLERANCE

from tokenviz.backends.served.completions import ServedChoice
from tokenviz.backends.served.engine import ServedEngine
from tokenviz.backends.shared.endpoint import ApiKey
from tokenviz.contract.engine import Caching, DrawingEngine, Engine
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Attribution
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.chips import chips_of, token_chips
from tokenviz.journey.session import Session
from tokenviz.ui.panes.attribution import AttributionPane
from tokenviz.ui.screens import LongJobScreen

pytestmark = pytest.mark.served

GREEDY = SamplingSettings(temperature=0, max_new_tokens=8)


@pytest.fixture
def engine(vllm_server, monkeypatch) -> ServedEngine:
    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    return ServedEngine.open(ServedChoice(vllm_server.url, api_key=ApiKey(env=KEY_ENV)))


def run(session: Session) -> None:
    while session.step() is not None:
        pass


def test_the_served_engine_is_an_engine_that_draws_and_declares_what_it_exposes(engine):
    assert isinstance(engine, Engine) and isinstance(engine, DrawingEngine) and not isinstance(engine, Caching)
    info = engine.info
    assert info.capabilities == ("step", "leave-one-out")  # (a plain server: no lens, attention or steering)
    assert info.vocab == 49152 and info.context == 2048 and info.covers == 20 and info.chat_template
    assert engine.decode(engine.encode(PROMPT)) == PROMPT


@pytest.mark.bundled
def test_a_served_journey_is_the_local_one(engine, bundled):
    """Greedy on the server and here (float32): the same tokens; each step's top-20 probabilities, the
    drawn token's rank and the prompt's own log-probabilities within SERVED_TOLERANCE of the local ones."""
    from tokenviz.backends.transformers.runner import ModelRunner

    served, local = Session(engine, GREEDY), Session(ModelRunner(bundled), GREEDY)
    for s in (served, local):
        s.start(PROMPT)
        run(s)
    assert served.ids == local.ids and served.generated_text == " the Champ de la Corée, a"
    for theirs, mine in zip(served.records, local.records):
        assert theirs.decision.mode == "drawn" and theirs.decision.raw_rank == mine.decision.raw_rank == 1
        own = {c.id: math.log(c.prob) for c in mine.top}
        assert [c.id for c in theirs.top][:10] == [c.id for c in mine.top][:10]
        for c in theirs.top:
            if c.id in own:
                assert abs(math.log(c.prob) - own[c.id]) < SERVED_TOLERANCE
        assert theirs.entropy <= mine.entropy + 1e-3  # the floor of what the top-20 leaves unknown
        assert theirs.forward_ms > 0  # the request's latency
    for theirs, mine in zip(served.records[0].prompt_predictions, local.records[0].prompt_predictions):
        assert theirs.next_rank == mine.next_rank and abs(theirs.logprob - mine.logprob) < SERVED_TOLERANCE
    assert served.records[0].prompt_predictions[0].next_rank == 730  # " E", as the server says


@pytest.mark.bundled
def test_forcing_rewinding_and_branching_on_the_server(engine, bundled):
    """A token forced outside the top-20 gets its probability and rank from the server's prompt
    log-probabilities (the local model's, within the tolerance); rewinding gives the same path back;
    a branch is kept and switched to."""
    from tokenviz.backends.transformers.runner import ModelRunner

    served, local = Session(engine, GREEDY), Session(ModelRunner(bundled), GREEDY)
    for s in (served, local):
        s.start(PROMPT)
        s.step()
    rare = local.records[-1].top[-1].id + 0  # the local top-20's last; then one surely past it
    far = next(t for t in range(1000, 2000) if t not in {c.id for c in served.records[-1].top})
    for s in (served, local):
        s.step(forced_id=far)
    theirs, mine = served.records[-2].decision, local.records[-2].decision
    assert theirs.mode == mine.mode == "forced" and theirs.chosen_id == far and theirs.raw_rank == mine.raw_rank
    assert abs(math.log(theirs.raw_prob) - math.log(mine.raw_prob)) < SERVED_TOLERANCE
    path = list(served.ids)
    served.step()
    served.rewind(2)
    assert served.ids == path[:-1] and served.pending is not None
    served.step(forced_id=rare)
    assert served.branches and served.ids[-1] == rare
    served.switch_branch(0)
    assert served.ids[: len(path)] == path
    served.reset()
    assert served.generated_ids == [] and served.pending is not None and served.pending.decision.chosen_id == 260


@pytest.mark.bundled
def test_leave_one_out_on_the_server_is_the_local_one(engine, bundled):
    """Attribution by leaving out each token, a request each: the local model's scores within the
    tolerance; gradient × input is refused in one line (it needs the weights)."""
    from tokenviz.backends.transformers.runner import ModelRunner

    served, local = Session(engine, GREEDY), Session(ModelRunner(bundled), GREEDY)
    for s in (served, local):
        s.start(PROMPT)
        s.step()
    done = []
    theirs = served.analyses.attribute(len(served.prompt_ids) - 1, "loo", lambda d, t: done.append((d, t)))
    mine = local.analyses.attribute(len(local.prompt_ids) - 1, "loo")
    assert theirs.target_id == mine.target_id == 260 and done[-1] == (7, 7)
    assert abs(theirs.logprob - mine.logprob) < SERVED_TOLERANCE
    assert all(abs(a - b) < 2 * SERVED_TOLERANCE for a, b in zip(theirs.scores, mine.scores))
    with pytest.raises(TokenvizError, match="gradient × input needs the engine's attribution"):
        from tokenviz.contract.commands import Attribute
        from tokenviz.journey.views import compute

        compute(served, Attribute(position=3, method="grad"))


@pytest.mark.bundled
def test_a_watched_token_is_followed_within_the_servers_top_n(engine, bundled):
    """Watching " Paris" after three steps fills the steps taken from the top-20 each kept (no request)
    and follows it from then on: its probability and rank the local model's where the server returned
    it, 0 and past the top-20 where it did not."""
    from tokenviz.backends.transformers.runner import ModelRunner

    served, local = Session(engine, GREEDY), Session(ModelRunner(bundled), GREEDY)
    for s in (served, local):
        s.start(PROMPT)
        for _ in range(3):
            s.step()
    requests = engine.endpoint.requests
    paris = served.watch(" Paris")
    assert paris == local.watch(" Paris") == 7042 and engine.endpoint.requests <= requests + 1  # (its piece)
    for s in (served, local):
        s.step()
    inside = 0
    for theirs, mine in zip(served.records, local.records):
        (t,), (m,) = theirs.decision.pinned, mine.decision.pinned
        if t.rank <= 20:
            inside += 1
            assert t.rank == m.rank and abs(math.log(t.prob) - math.log(m.prob)) < SERVED_TOLERANCE
        else:
            assert t.prob == 0 and m.rank > 20
    assert inside >= 1


@pytest.mark.bundled
def test_chat_on_the_server_is_the_local_chat(engine, bundled):
    """A chat prompt through the server's template: the ids the local template gives, the template's
    own tokens marked, the user's words not; the server's mode measured at the start and said."""
    from tokenviz.backends.transformers.runner import ModelRunner

    served, local = Session(engine, GREEDY), Session(ModelRunner(bundled), GREEDY)
    for s in (served, local):
        s.start("What is the capital of France?", chat=True)
    assert served.prompt_ids == local.prompt_ids
    assert served.template == local.template and any(served.template) and not all(served.template)
    assert served.pending.decision.chosen_id == local.pending.decision.chosen_id
    assert engine.raw is True and "before the sampling settings (raw)" in engine.info.distribution
    assert engine.info.architecture.startswith("smollm2 on vLLM 0.32")


def test_settings_are_sent_to_the_server_and_seeded_draws_reproduce(engine):
    """The settings go with each request: a sampled journey with one seed is the same twice; changing
    the settings draws again at once (top-k 1 takes the top token); the stages are recomputed over the
    top-20 only, marked so by their counts."""
    settings = SamplingSettings(temperature=1.2, top_k=0, top_p=1.0, seed=5, max_new_tokens=6)
    paths = []
    for _ in range(2):
        s = Session(engine.twin(), settings)
        s.start(PROMPT)
        run(s)
        paths.append(s.ids)
    assert paths[0] == paths[1]
    s = Session(engine, settings)
    s.start(PROMPT)
    s.set_settings(dataclasses.replace(settings, top_k=1, temperature=0.7))
    d = s.pending.decision
    assert d.mode == "drawn" and d.chosen_id == s.pending.top[0].id
    assert [st.name for st in d.stages] == ["temperature", "top-k"] and d.stages[0].kept == 20
    assert d.stages[1].kept == 1 and math.isclose(d.raw_prob, s.pending.top[0].prob)


def test_a_server_that_stops_answering_loses_nothing_and_a_step_retries(engine):
    s = Session(engine, GREEDY)
    s.start(PROMPT)
    s.step()
    before, url = (list(s.ids), list(s.records)), engine.endpoint.url
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    engine.endpoint.url = f"http://127.0.0.1:{port}/v1"  # as if the server died
    with pytest.raises(TokenvizError, match=r"the server at 127\.0\.0\.1:\d+ stopped answering") as failure:
        s.step()
    assert "\n" not in str(failure.value)
    assert (s.ids, s.records) == before  # the journey as it was
    engine.endpoint.url = url  # the server is back: the same key steps
    assert s.step() is not None and len(s.ids) == len(before[0]) + 1


def test_a_grammar_is_refused_in_one_line_on_a_served_model(engine):
    from tokenviz.contract.grammar import Grammar

    s = Session(engine, GREEDY)
    s.start(PROMPT)
    with pytest.raises(
        TokenvizError,
        match=r"a grammar stage needs the engine's grammar stage, which .* does not give: the server draws each "
        r"token itself, and a grammar stage needs tokenviz to draw",
    ):
        s.set_settings(GREEDY.replace(grammar=Grammar("regex", " (Paris|Rome)", " (Paris|Rome)")))
    assert s.settings.grammar is None


async def test_the_app_on_a_served_model(engine, vllm_server, tmp_path, monkeypatch):
    """At 80x24: steps and live settings; the next-token pane says what the numbers are; the keys of
    what a server does not expose say so in one line; an export holds no trace of the key."""
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    monkeypatch.chdir(tmp_path)
    worker = EngineWorker(lambda progress: engine, SamplingSettings(temperature=0), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(80, 24)) as pilot:
        s = await settle(app, pilot)
        assert s.info is not None and s.info.covers == 20 and s.error is None
        for key in ("space", "space", "T"):
            await pilot.press(key)
            s = await settle(app, pilot)
        assert len(s.chips) - s.prompt_len == 2 and s.settings.temperature == pytest.approx(0.1) and s.error is None
        assert s.pending is not None and s.pending.decision.settings.temperature == pytest.approx(0.1)
        from tokenviz.ui.panes.next_token import NextTokenPane

        subtitle = str(app.query_one(NextTokenPane).border_subtitle)
        assert "server" in subtitle and "H ≥" in subtitle
        await pilot.press("i")  # the timing view: requests, not forward passes
        await wait_for(lambda: "one request" in str(app.query_one("#timing").body.render()), pilot)
        await pilot.press("i")
        attention = "\n".join(strip.text for strip in app.query_one("#attention")._strips)
        assert "a served model" in attention
        for key, words in (
            ("l", "no vllm-lens plugin (M says more)"),
            ("v", "keeps its own KV cache"),
            ("z", "a head cannot be ablated inside a server"),  # (finding 22: said first, not "choose a head")
        ):
            await pilot.press(key)  # (issue 69, finding 4: each names the reason and the remedy)
            await wait_for(lambda w=words: any(w in str(n.message) for n in app._notifications), pilot)
        lines = [
            str(n.message)
            for n in app._notifications
            if any(w in str(n.message) for w in ("served model", "KV", "server;"))
        ]
        assert len(lines) >= 3 and all("\n" not in line and " needs the " not in line for line in lines), lines
        app.screen.query_one(AttributionPane).measured["loo"] = (2, 60.0)  # as on a slow server: asked before it starts
        await pilot.press("A")  # leave-one-out: a request per token, its progress shown
        await wait_for(lambda: isinstance(app.screen, LongJobScreen), pilot)
        assert [answer for _, answer in app.screen.choices] == ["loo"]  # (no gradient × input on a server)
        await pilot.press("enter")
        await wait_for(lambda: any(isinstance(r, Attribution) for r in app.journey.snapshot.results), pilot, timeout=90)
        await pilot.press("x")
        await wait_for(lambda: len(list(tmp_path.glob("tokenviz-*"))) == 3, pilot, timeout=60)
    for written in tmp_path.glob("tokenviz-*"):
        assert vllm_server.key not in written.read_text(errors="replace")
    page = next(tmp_path.glob("tokenviz-*.json")).read_text()
    assert re.search(r'"covers":\s*20', page) and '"drawn"' in page


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))  # (the browser's helpers)


@pytest.mark.terminal
def test_tokenviz_on_an_endpoint_in_a_real_terminal(vllm_server):
    """The two lines `python -m tokenviz.cli.start_vllm` prints to paste (`export KEY=...`, then
    `tokenviz PROMPT --endpoint URL --api-key-env KEY`), run at 80x24 in tmux: the app opens on the
    served model, steps, a setting changed live is sent with the next request, and the branches view
    says where the paths part, whole, and that a path's tokens go with the next request."""
    from terminals import ENV, KEEP_S, end, keys, new_session, own_state, unique_name, wait_screen

    from tokenviz.cli.start_vllm import paste_lines

    port = int(vllm_server.url.rsplit(":", 1)[1].split("/")[0])
    export, app = paste_lines(port, vllm_server.key)
    app = app.replace("tokenviz ", f"{sys.executable} -m tokenviz ", 1) + " --temperature 0"
    name = unique_name()
    command = f"{export}; {app}; echo TOKENVIZ-EXITED $?; sleep {KEEP_S}"
    new_session(name, (80, 24), command, {**os.environ, **ENV, **own_state()})
    try:
        wait_screen(name, r"ready · step 0")
        text = wait_screen(name, r"served at 127\.0\.0\.1")
        assert "server" in text
        keys(name, "Space", "Space")
        text = wait_screen(name, r"step 2 ")
        assert "the Champ" in text
        keys(name, "T")
        text = wait_screen(name, r"T 0\.10")
        assert vllm_server.key not in text
        keys(name, "BSpace", "3", "b")  # (issue 69, finding 17: another token at step 1, the old path a branch)
        text = wait_screen(name, r"2 paths · part after \d+ ─")
        flat = " ".join(line.split("││")[0].strip("│ ") for line in text.splitlines())  # (the left pane's)
        assert "its tokens go with the next request" in " ".join(flat.split()), text  # (a server keeps its cache)
        assert "rebuilt from the shared prefix" not in flat and "positio…" not in text
    finally:
        end(name)


def test_the_app_on_an_endpoint_refuses_at_once_in_one_line(monkeypatch, capsys, vllm_server):
    """Before the app opens: an unreachable server, a refused key (never echoed), an unknown model, an
    option for a model loaded here; each one line and exit 2."""
    from clitools import invoke
    from test_served import one_error

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    wrong = "not-the-key-" + "y" * 10
    monkeypatch.setenv(KEY_ENV, wrong)
    key = ["--api-key-env", KEY_ENV]
    for args, line in (
        (["--endpoint", f"http://127.0.0.1:{port}/v1"], "cannot reach the server at 127.0.0.1"),
        (["--endpoint", vllm_server.url, *key], "refused the API key (HTTP 401)"),
        (["--endpoint", vllm_server.url, "--model", "gpt2"], "--model is for a model loaded here"),
        (["--served-model", "x"], "go with --endpoint URL"),
    ):
        code, _, err = invoke(monkeypatch, capsys, PROMPT, *args)
        assert code == 2 and line in one_error(err) and wrong not in err, (args, err)
    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    code, _, err = invoke(monkeypatch, capsys, PROMPT, "--endpoint", vllm_server.url, *key, "--served-model", "big")
    assert code == 2 and "does not serve 'big'; it serves smollm2" in one_error(err)


@needs_browser
def test_serve_on_an_endpoint_in_a_browser(vllm_server, monkeypatch):
    """`tokenviz serve --endpoint URL --api-key-env VAR`: each tab a client of the model's server; the
    page opens on the served model and a key steps it."""
    from test_serve_in_browser import frames, open_app, press, start_server

    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    process, url = start_server("--endpoint", vllm_server.url, "--api-key-env", KEY_ENV, "--temperature", "0")
    try:
        with chromium(1400, 900) as browser:
            open_app(browser, url)
            until(lambda: "served at 127.0.0.1" in frames(browser), 60, 0.2)
            press(browser, " ")
            until(lambda: "ready · step 1" in frames(browser), 60, 0.2)
            assert vllm_server.key not in frames(browser)
    finally:
        process.terminate()
        process.wait(10)


def test_a_local_tokenizer_is_checked_against_the_servers_once_and_then_used(vllm_server, monkeypatch, engine):
    """--tokenizer: the served model's own tokenizer here (the converted bundled directory's) tokenizes
    and decodes as the server does, so pieces cost no request; another model's is refused in one line."""
    from families import family_model

    from tokenviz.backends.shared.tokenizer import load_tokenizer
    from tokenviz.backends.transformers.gguf_cache import ensure_converted, gguf_cache_dir
    from tokenviz.system.paths import bundled_gguf

    directory = gguf_cache_dir(bundled_gguf())
    ensure_converted(bundled_gguf(), directory, lambda message, fraction: None)
    local = ServedEngine(engine.endpoint, engine.model, local_tokenizer=load_tokenizer(str(directory)))
    assert local.info.vocab == engine.info.vocab and local.encode(PROMPT) == engine.encode(PROMPT)
    here = load_tokenizer(str(directory))
    assert here.convert_tokens_to_ids("<|im_start|>") in local.special_ids  # marked, as on a local model
    s = Session(local, GREEDY)
    s.start(PROMPT)
    requests = local.endpoint.requests
    s.step()
    assert local.endpoint.requests - requests <= 2  # the draw (and a rank past the top-N): no piece asked
    assert [c.text for c in chips_of(s)] == [c.text for c in token_chips(engine, s.ids, len(s.prompt_ids), [])]
    with pytest.raises(TokenvizError, match="does not tokenize as"):
        ServedEngine(engine.endpoint, engine.model, local_tokenizer=family_model("gpt2").tokenizer)
    with pytest.raises(TokenvizError, match="cannot load the tokenizer"):
        load_tokenizer(str(directory / "nothing-here"))
