"""Hostile input in the app, in a real terminal (tmux) on a tiny model: a grammar that crashed the
process and a FIFO that froze it are each one message, the journey stays, and q still quits."""

import os

import pytest
from terminals import end, keys, quits_cleanly, start, tmux, wait_screen
from tiny import save_tiny

pytestmark = pytest.mark.terminal


def test_the_app_survives_the_crashing_grammar_and_a_fifo_and_quits(tmp_path):
    model = save_tiny(tmp_path / "tiny", "llama", context=64)
    chain = tmp_path / "chain.lark"
    chain.write_text("\n".join(["start: r0", *(f'r{i}: r{i + 1} | "x"' for i in range(3000)), 'r3000: "z"']))
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    name = start((120, 36), "The cat", "--model", model, "--temperature", "0")
    try:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        wait_screen(name, r"ready · step 2")
        for line, said in [(f"json-schema {fifo}", "not a regular file"), (str(chain), "chain.lark")]:
            keys(name, "G")
            wait_screen(name, r"grammar", timeout=30)
            tmux(name, "send-keys", "-t", name, "-l", line)
            keys(name, "Enter")
            wait_screen(name, said, timeout=60)  # (it had frozen the app, or killed it with SIGSEGV)
            assert "TOKENVIZ-EXITED" not in tmux(name, "capture-pane", "-p", "-t", name)
        keys(name, "Space")
        wait_screen(name, r"ready · step 3")  # the journey went on from where it was
        quits_cleanly(name)
    finally:
        end(name)
