"""A crash inside llama.cpp never takes the journey or the terminal with it: the process dies by a
segmentation fault (as a fault in llama.cpp's C++ ends it, past anything Python can run), the terminal is
given back and says so, its journal stays, and --restore gives back every token, in a real terminal."""

import os
import re
import signal

import pytest
from llama_reference import offloaded_args

pytestmark = [pytest.mark.llamacpp, pytest.mark.terminal, pytest.mark.usefixtures("llama_cpp")]


def test_a_segfault_inside_llama_cpp_leaves_the_journey_and_restore_takes_it_again(tmp_path):
    from terminals import given_back, keys, quits_cleanly, terminal, tokenviz_pid, wait_screen

    env = {"XDG_STATE_HOME": str(tmp_path)}  # (the journals of this test alone)
    args = ("--backend", "llama.cpp", *offloaded_args(), "--temperature", "0")
    journals = tmp_path / "tokenviz" / "journals"
    with terminal((120, 36), *args, env=env) as name:
        wait_screen(name, r"ready · step 0", timeout=120)
        for generated in (1, 2, 3):
            keys(name, "space")
            wait_screen(name, rf"{generated} generated")
        keys(name, "BSpace")
        shown = wait_screen(name, r"2 generated")
        text = re.search(r"text: (.*?)\s*│", shown).group(1)
        os.kill(int(tokenviz_pid(name)), signal.SIGSEGV)
        given_back(name)  # (the process ended: the main screen, no mouse reported, the cursor shown, by the
        # watcher of system.terminal_guard, which the screen's "TOKENVIZ-EXITED" may come before or after)
        assert "tokenviz ended without quitting" in wait_screen(name, r"ended without quitting", timeout=30)
    assert len(list(journals.glob("*.jsonl"))) == 1  # (no exit handler ran to remove it)

    # (The next plain start offers it: tests/worker/test_journaling.py, without a third start here.)
    with terminal((120, 36), *args, "--restore", env=env) as name:
        wait_screen(name, r"restored the journey", timeout=120)
        shown = wait_screen(name, r"2 generated")
        assert f"text: {text}" in shown, shown
        quits_cleanly(name)
    assert not list(journals.glob("*.jsonl"))  # the restored one taken, the new one ended with its process
