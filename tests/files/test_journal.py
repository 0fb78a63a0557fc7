"""A journey's journal: a line a change, read back as the path it leaves; a journal whose process
died is found by its free lock; a damaged one is one line."""

import json

import pytest

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import HeadAblation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.journal import (
    MAX_JOURNAL_BYTES,
    MAX_LINES,
    MAX_PROMPT_CHARS,
    JournalFollower,
    JournalWriter,
    forget,
    journal_model,
    orphans,
    read_journal,
)

GREEDY, WARM = SamplingSettings(temperature=0), SamplingSettings(temperature=0.9, seed=3)
BEGUN = ("The capital of France is", False, None)


def test_the_journal_reads_back_the_path_with_each_tokens_settings(tmp_path):
    writer = JournalWriter(tmp_path, "tiny")
    follower = JournalFollower(writer)
    follower.follow(BEGUN, GREEDY, (), [], moved=True)
    follower.follow(BEGUN, GREEDY, (), [5, 6], moved=False)
    follower.follow(BEGUN, WARM, (HeadAblation(1, 2, False),), [5, 6, 7], moved=False)
    follower.follow(BEGUN, WARM, (HeadAblation(1, 2, False),), [5, 9], moved=True)  # a rewind, then a token
    lines = writer.path.read_text().splitlines()
    assert len(lines) == 10  # header, start, settings, 5, 6, settings, ablation, 7, cut, 9
    assert json.loads(lines[-2]) == {"cut": 1} and json.loads(lines[-1]) == {"token": 9}
    journal = read_journal(writer.path)
    assert journal.model == "tiny" and journal.prompt.prompt == BEGUN[0] and journal.settings == GREEDY
    assert [(t.token, t.settings, t.interventions) for t in journal.taken] == [
        (5, GREEDY, ()),
        (9, WARM, (HeadAblation(1, 2, False),)),
    ]
    assert journal.final_settings == WARM and journal.final_interventions == (HeadAblation(1, 2, False),)
    writer.discard()
    assert not writer.path.exists()


def test_a_step_costs_a_line_not_the_journeys_length(tmp_path):
    writer = JournalWriter(tmp_path, "tiny")
    follower = JournalFollower(writer)
    path = list(range(3000))
    follower.follow(BEGUN, GREEDY, (), path, moved=True)
    before = writer.path.stat().st_size
    follower.follow(BEGUN, GREEDY, (), [*path, 7], moved=False)
    assert writer.path.stat().st_size - before == len('{"token": 7}\n')
    writer.discard()


def test_only_a_dead_processs_journal_is_an_orphan_and_a_cut_off_last_line_is_left_out(tmp_path):
    live = JournalWriter(tmp_path, "tiny")
    JournalFollower(live).follow(BEGUN, GREEDY, (), [1], moved=True)
    assert orphans(tmp_path) == []  # (its lock is held)
    dead = tmp_path / "20261129-000000-1-1.jsonl"
    dead.write_text(live.path.read_text() + '{"tok')  # the process died writing a line
    assert orphans(tmp_path) == [dead] and journal_model(dead) == "tiny"
    assert [t.token for t in read_journal(dead).taken] == [1]
    forget(dead)
    assert orphans(tmp_path) == []
    live.discard()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json\n",
        '{"format": "tokenviz-journal/1", "model": "m", "started": 1}\n',  # no prompt
        '{"format": "other", "model": "m", "started": 1}\n',
        '{"format": "tokenviz-journal/1", "model": "m", "started": 1}\n{"start": {"prompt": "x"}}\n{"token": -1}\n',
        '{"format": "tokenviz-journal/1", "model": "m", "started": 1}\n{"start": {"prompt": "x"}}\n{"evil": 1}\n',
        '{"format": "tokenviz-journal/1", "model": "m", "started": 1}\n{"start": {"prompt": "x"}}\n'
        '{"settings": {"temperature": "hot"}}\n',
        "[" * 100_000 + "\n",
    ],
    ids=["empty", "text", "no-prompt", "format", "negative-token", "unknown-line", "bad-settings", "deep"],
)
def test_a_damaged_journal_is_one_line(tmp_path, text):
    path = tmp_path / "j.jsonl"
    path.write_text(text)
    with pytest.raises(TokenvizError, match=r"^the journal j\.jsonl is damaged( at [^:]+)?: ") as caught:
        read_journal(path)
    assert "\n" not in str(caught.value)


def test_a_journals_model_is_made_safe_to_print_and_its_prompt_kept_as_typed(tmp_path):
    """The model's name is said in lines and notices: made safe. The prompt is the journey's input: kept
    character for character (made safe, "Hello\x01" came back as 9 more characters and other tokens),
    and shown only as the app shows any prompt, through its escaped chips."""
    path = tmp_path / "j.jsonl"
    header = {"format": "tokenviz-journal/1", "model": "m\x1b]0;x\x07", "started": 1}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"start": {"prompt": "a\x1b[2Jb"}}) + "\n")
    journal = read_journal(path)
    assert "\x1b" not in journal.model and journal.prompt.prompt == "a\x1b[2Jb"


def test_a_prompt_with_control_characters_comes_back_as_typed_with_its_ids(tmp_path):
    begun = ("Hello\x01\tworld\x1b[1m is", True, "be\x07brief")
    writer = JournalWriter(tmp_path, "tiny")
    JournalFollower(writer).follow(begun, GREEDY, (), [11, 12, 13, 40], moved=True, prompt_len=3)
    journal = read_journal(writer.path)
    assert (journal.prompt.prompt, journal.prompt.chat, journal.prompt.system) == begun
    assert journal.prompt.ids == [11, 12, 13] and [t.token for t in journal.taken] == [40]
    writer.discard()


def lines(*events: dict, started: float = 1.0) -> str:
    header = {"format": "tokenviz-journal/1", "model": "m", "started": started}
    return "".join(json.dumps(line) + "\n" for line in (header, *events))


@pytest.mark.parametrize(
    "text, said",
    [
        (lines({"start": {"prompt": "x"}}, started=1e300), "started"),
        (lines({"start": {"prompt": "x" * (MAX_PROMPT_CHARS + 1)}}), "prompt"),
        (lines({"start": {"prompt": "x", "ids": [-1]}}), "ids"),
        (lines({"start": {"prompt": "x"}}) + '{"token": 1}\n' * (MAX_LINES + 1), f"holds over {MAX_LINES:,} lines"),
    ],
    ids=["started-1e300", "prompt-too-long", "negative-id", "too-many-lines"],
)
def test_a_journal_past_its_bounds_is_one_line_naming_why(tmp_path, text, said):
    path = tmp_path / "j.jsonl"
    path.write_text(text)
    with pytest.raises(TokenvizError, match=r"^the journal j\.jsonl is damaged( at [^:]+)?: ") as caught:
        read_journal(path)
    assert said in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_a_journal_of_millions_of_lines_is_refused_in_bounded_memory(tmp_path):
    """64 MB of 5.6 million lines took 1.75 GB to read and was called "no header"."""
    import tracemalloc

    path = tmp_path / "j.jsonl"
    with path.open("w") as out:
        out.write(lines({"start": {"prompt": "x"}}))
        out.write("{}\n" * ((MAX_JOURNAL_BYTES - 200) // 3))
    tracemalloc.start()
    try:
        with pytest.raises(TokenvizError, match="holds over"):
            read_journal(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_JOURNAL_BYTES + (32 << 20), peak  # the file's bytes, and little beside them


def test_a_fifo_or_a_directory_in_the_journals_folder_is_passed_over(tmp_path):
    """A FIFO named like a journal held every start at "prefilling" (the worker opened it)."""
    import os
    import threading

    os.mkfifo(tmp_path / "20261129-000000-1-fifo.jsonl")
    (tmp_path / "20261129-000000-1-dir.jsonl").mkdir()
    dead = tmp_path / "20261129-000000-1-dead.jsonl"
    dead.write_text(lines({"start": {"prompt": "x"}}))
    found: list = []
    looking = threading.Thread(target=lambda: found.append([(p, journal_model(p)) for p in orphans(tmp_path)]))
    looking.start()
    looking.join(30)
    assert found == [[(dead, "m")]]
    assert journal_model(tmp_path / "20261129-000000-1-fifo.jsonl") is None
    with pytest.raises(TokenvizError, match="not a regular file"):
        read_journal(tmp_path / "20261129-000000-1-fifo.jsonl")


def test_a_write_that_fails_ends_the_journal_rather_than_leave_one_with_a_gap(tmp_path):
    writer = JournalWriter(tmp_path, "tiny")
    follower = JournalFollower(writer)
    follower.follow(BEGUN, GREEDY, (), [1, 2], moved=True)

    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def close(self):
            pass

    writer._file = Full()
    follower.follow(BEGUN, GREEDY, (), [1, 2, 3], moved=False)  # (no exception reaches the journey)
    follower.follow(BEGUN, GREEDY, (), [1, 2, 3, 4], moved=False)
    assert not writer.path.exists() and orphans(tmp_path) == []
