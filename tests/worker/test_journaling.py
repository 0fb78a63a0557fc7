"""A journey outlives a process that dies: the worker keeps it in a journal as it goes; the next
start on the same model offers it; --restore takes every token again, under the settings of its time."""

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

from apptools import PROMPT
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.journal import orphans
from tokenviz.files.record_json import settings_json
from tokenviz.worker.engine_thread import EngineWorker
from tokenviz.worker.journaling import Journaling

# A process that takes a journey (steps, a rewind, a setting typed, more steps), says its tokens and
# settings, and is killed: nothing of Python's runs after (no exit handler removes its journal).
CHILD = """
import json, os, signal, sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from apptools import PROMPT
from tiny import tiny_model
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Assign, Rewind, Step
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.journal import orphans
from tokenviz.worker.engine_thread import EngineWorker
from tokenviz.worker.journaling import Journaling
from tokenviz.files.record_json import settings_json

seen = []
loader = lambda progress: ModelRunner(tiny_model("llama"))
worker = EngineWorker(loader, SamplingSettings(seed=1), PROMPT, journaling=Journaling(Path({folder!r})))
worker.start(seen.append)
commands = [Step(), Step(), Rewind(1), Assign(("temperature=1.3", "top_k=5")), Step(), Step()]
while not (seen and seen[-1].state == "ready"):
    time.sleep(0.05)
for command in commands:
    worker.submit(command)
while not (seen[-1].handled == len(commands) and seen[-1].state == "ready"):
    time.sleep(0.05)
session = worker.session
print(json.dumps({{"ids": session.generated_ids, "settings": settings_json(session.settings)}}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def journey_of_a_killed_process(folder: Path) -> dict:
    tests = str(Path(__file__).parents[1])
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(tests=tests, folder=str(folder))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def first_ready(journaling: Journaling):
    """The worker's first snapshot once its journey has started, and the worker."""
    arrived, seen = threading.Event(), []

    def post(snapshot):
        seen.append(snapshot)
        if snapshot.state == "ready" and snapshot.records:
            arrived.set()

    loader = lambda progress: ModelRunner(tiny_model("llama"))  # noqa: E731
    worker = EngineWorker(loader, SamplingSettings(seed=1), PROMPT, journaling=journaling)
    worker.start(post)
    assert arrived.wait(120), seen[-1:]
    return next(s for s in seen if s.state == "ready" and s.records), worker


def test_a_killed_process_leaves_its_journey_the_next_start_offers_it_and_restore_takes_it_again(tmp_path):
    kept = journey_of_a_killed_process(tmp_path)
    assert len(kept["ids"]) == 3 and len(left := list(tmp_path.glob("*.jsonl"))) == 1

    offered, worker = first_ready(Journaling(tmp_path))
    assert "was left when its process died at " in (offered.notice or "") and "--restore" in offered.notice
    worker.stop()

    restored, worker = first_ready(Journaling(tmp_path, restore=True))
    try:
        assert "restored the journey" in (restored.notice or "") and "3 tokens" in restored.notice
        session = worker.session
        assert session.generated_ids == kept["ids"] and session.prompt == PROMPT
        assert settings_json(session.settings) == kept["settings"]  # (the settings typed, in force again)
        taken = session.records[:3]  # (record i decided token i; the last record is pending)
        assert [r.decision.mode for r in taken] == ["forced"] * 3 and session.records[3].decision.mode == "sampled"
        assert [r.decision.settings.temperature for r in taken] == [0.7, 1.3, 1.3]  # each under its time's
    finally:
        worker.stop()
    # The journal restored is gone; those the two later workers keep are live (their locks held here).
    assert not left[0].exists() and len(list(tmp_path.glob("*.jsonl"))) == 2 and orphans(tmp_path) == []


def test_restore_with_nothing_to_restore_says_so_and_starts_the_prompt(tmp_path):
    snapshot, worker = first_ready(Journaling(tmp_path / "none", restore=True))
    try:
        assert "no journey of" in (snapshot.error or "") and "to restore" in snapshot.error
        assert snapshot.prompt == PROMPT and len(snapshot.records) == 1
    finally:
        worker.stop()


def test_an_orderly_end_removes_the_journal(tmp_path, monkeypatch):
    import atexit

    at_exit = []
    monkeypatch.setattr(atexit, "register", at_exit.append)  # (what the app's exit runs: exit_now)
    _, worker = first_ready(Journaling(tmp_path))
    assert len(list(tmp_path.glob("*.jsonl"))) == 1 and len(at_exit) == 1
    worker.stop()
    at_exit[0]()
    assert not list(tmp_path.glob("*.jsonl")) and not list(tmp_path.glob("*.lock"))


def tiny_key() -> str:
    from tokenviz.worker.journaling import model_key

    return model_key(ModelRunner(tiny_model("llama")).info)


def left_journal(folder: Path, prompt: dict, tokens=(), key: str | None = None, started: float = 1.0) -> Path:
    """A journal as a process that died would leave it (its lock free)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "20261129-000000-1-left.jsonl"
    header = {"format": "tokenviz-journal/1", "model": key or tiny_key(), "started": started}
    events = [header, {"start": prompt}, *({"token": t} for t in tokens)]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_a_prompt_with_control_characters_is_restored_to_the_same_token_ids(tmp_path):
    """Made safe on the way back, "Hello\\x01\\tworld\\x1b[1m is" came back as other text, 19 tokens for 9."""
    from tokenviz.journey.prompt import tokenize

    typed = "Hello\x01\tworld\x1b[1m is"
    ids = tokenize(ModelRunner(tiny_model("llama")), typed, False, None)[1]
    left = left_journal(tmp_path, {"prompt": typed, "ids": ids}, tokens=[5, 6])
    restored, worker = first_ready(Journaling(tmp_path, restore=True))
    try:
        assert "restored the journey" in (restored.notice or ""), restored.error
        assert worker.session.prompt == typed and worker.session.prompt_ids == ids
        assert worker.session.generated_ids == [5, 6]
    finally:
        worker.stop()
    assert not left.exists()


def test_a_journal_whose_prompt_gives_other_tokens_now_is_not_called_restored_and_is_kept(tmp_path):
    left = left_journal(tmp_path, {"prompt": "Hello world", "ids": [1, 2, 3, 4, 5, 6, 7]}, tokens=[5])
    restored, worker = first_ready(Journaling(tmp_path, restore=True))
    worker.stop()
    said = restored.notice or ""
    assert "restoring stopped part way: its prompt gives other tokens now (7 then," in said, said
    assert left.exists()


def test_a_journal_that_cannot_be_read_back_is_kept_and_the_prompt_given_starts(tmp_path):
    """ "started": 1e300 ended the app in "internal error while loading" with the journal already gone."""
    left = left_journal(tmp_path, {"prompt": "Hello"}, started=1e300)
    snapshot, worker = first_ready(Journaling(tmp_path, restore=True))
    worker.stop()
    assert "is damaged at started" in (snapshot.error or "") and snapshot.prompt == PROMPT
    assert left.exists()


def test_a_journey_of_another_runtime_is_named_and_not_restored_in_this_one(tmp_path):
    """A llama.cpp journal restored by a plain --restore ran in transformers float32 and was called restored."""
    other = tiny_key().replace("(transformers,", "(llama.cpp,")
    assert other != tiny_key()
    left = left_journal(tmp_path, {"prompt": "Hello"}, tokens=[5], key=other)
    snapshot, worker = first_ready(Journaling(tmp_path, restore=True))
    worker.stop()
    said = snapshot.error or ""
    assert f"no journey of {tiny_key()} to restore; the journeys left are of {other}" in said, said
    assert "start tokenviz with that model, backend and dtype" in said and left.exists()


def test_an_end_without_the_user_quitting_keeps_the_journal_for_the_next_start(tmp_path, monkeypatch):
    """SIGTERM or SIGHUP (the command line calls keep_journals) deleted the journal, so --restore had nothing."""
    import atexit

    from tokenviz.worker.journaling import keep_journals

    at_exit = []
    monkeypatch.setattr(atexit, "register", at_exit.append)
    _, worker = first_ready(Journaling(tmp_path))
    worker.stop()
    keep_journals()
    at_exit[0]()  # (the exit handler then removes nothing)
    left = list(tmp_path.glob("*.jsonl"))
    assert len(left) == 1 and orphans(tmp_path) == left  # (its lock free: offered at the next start)
