"""Run the command line in-process, as a user would from a shell."""

import contextlib
import io
import os
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


def invoke_with(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tokenviz ARGS...` with `env` added to the environment, where no
    fixture is at hand: argv, the environment and both streams are put back afterwards."""
    out, err = io.StringIO(), io.StringIO()
    argv, before = sys.argv, {name: os.environ.get(name) for name in env}
    sys.argv = ["tokenviz", *args]
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
            run()
    finally:
        sys.argv = argv
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return exit_info.value.code or 0, out.getvalue(), err.getvalue()
