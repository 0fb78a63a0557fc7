"""Run the command line in-process, as a user would from a shell."""

import sys

import pytest

from tokenviz.cli import run


def invoke(monkeypatch, capsys, *args):
    """(exit code, stdout, stderr) of `tokenviz ARGS...`."""
    monkeypatch.setattr(sys, "argv", ["tokenviz", *args])
    with pytest.raises(SystemExit) as exit_info:
        run()
    out = capsys.readouterr()
    return exit_info.value.code or 0, out.out, out.err
