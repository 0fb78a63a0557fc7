"""An app that dies gives the terminal back and keeps its journey, in a real terminal: SIGKILL (as a fault
inside a native runtime ends it, past anything Python can run) leaves the terminal to the watcher
(system.terminal_guard), which restores it and says so; SIGTERM or SIGHUP (a kill, a closed terminal) is
an orderly end that keeps the journal, which --restore takes again."""

import os
import signal

import pytest

pytestmark = [pytest.mark.terminal]


def test_a_killed_app_gives_the_terminal_back_and_says_the_journey_is_kept(tmp_path):
    from terminals import given_back, keys, terminal, terminal_modes, tmux, tokenviz_pid, wait_screen

    env = {"XDG_STATE_HOME": str(tmp_path)}
    with terminal((100, 30), "--temperature", "0", env=env) as name:
        wait_screen(name, r"ready · step 0", timeout=120)
        keys(name, "space")
        wait_screen(name, r"1 generated")
        assert terminal_modes(name)["alternate_on"] == "1" and terminal_modes(name)["mouse_any_flag"] == "1"
        os.kill(int(tokenviz_pid(name)), signal.SIGKILL)
        given_back(name)
        wait_screen(name, r"ended without quitting", timeout=30)
        said = tmux(name, "capture-pane", "-p", "-J", "-t", name)  # (-J: a line the terminal wrapped, whole)
        assert "tokenviz ended without quitting" in said and "the terminal is restored" in said, said
        assert "journal is kept, and `tokenviz --restore` takes it again" in said, said
    assert len(list((tmp_path / "tokenviz" / "journals").glob("*.jsonl"))) == 1


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_mid_autoplay_keeps_the_journal_and_restore_takes_it_again(tmp_path, ending):
    from terminals import given_back, keys, quits_cleanly, terminal, tokenviz_pid, wait_screen

    env = {"XDG_STATE_HOME": str(tmp_path)}
    journals = tmp_path / "tokenviz" / "journals"
    with terminal((100, 30), "--temperature", "0", env=env) as name:
        wait_screen(name, r"ready · step 0", timeout=120)
        keys(name, "a")
        wait_screen(name, r"\b[3-9] generated|\b\d\d+ generated", timeout=120)
        os.kill(int(tokenviz_pid(name)), ending)
        assert f"TOKENVIZ-EXITED {128 + ending}" in wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=60)
        given_back(name)
        assert "ended without quitting" not in wait_screen(name, r"TOKENVIZ-EXITED")  # (an orderly end: no word)
    assert len(list(journals.glob("*.jsonl"))) == 1

    with terminal((100, 30), "--temperature", "0", "--restore", env=env) as name:
        wait_screen(name, r"restored the journey", timeout=120)
        quits_cleanly(name)
    assert not list(journals.glob("*.jsonl"))
