"""A backend plugin is another package's code, run as the command line is built: one that fails to import,
raises SystemExit, is no backend, takes a built-in's name, or declares an option a command has already is
left out with one line naming it and its package, and every command goes on (--help and replay among
them). Each plugin is a package installed into a folder of the test's own (an entry point on PYTHONPATH),
never into the test environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.hostile

BACKEND = """
from tokenviz.contract.backend import BackendOption

class Plugin:
    name, about, weights_here, draws = {name!r}, "a plugin", True, False
    options = ({options})

    def asked(self, given):
        {asked}

    def loader(self, opening):
        raise NotImplementedError

BACKEND = Plugin()
"""
PLUGINS = {
    "import raises": ("raise RuntimeError('\\x1b[31mboom\\x1b]52;c;eA==\\x07')", "it failed to load: <0x1B>[31mboom"),
    "SystemExit(3)": ("raise SystemExit(3)", "it failed to load: 3"),
    "object None": ("BACKEND = None", "it is not a backend (no name of printable text)"),
    "a name in ESC": (BACKEND.format(name="\x1b[2J", options="", asked="return False"), "no name of printable text"),
    "named transformers": (
        BACKEND.format(name="transformers", options="", asked="return False"),
        "the name 'transformers' is a backend's already",
    ),
}
OPTION_CLASHES = ["model", "steps", "temperature", "backend", "json"]


def install(folder: Path, source: str, point: str = "odd") -> dict[str, str]:
    """The package `oddpkg` holding `source` as its module, its entry point `point`, in `folder`; the
    environment that finds it."""
    (folder / "oddpkg_module.py").write_text(textwrap.dedent(source))
    info = folder / "oddpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: oddpkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[tokenviz.backends]\n{point} = oddpkg_module:BACKEND\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def tokenviz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenviz", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_a_broken_plugin_is_left_out_with_one_line_and_every_command_goes_on(tmp_path, plugin):
    source, said = PLUGINS[plugin]
    env = install(tmp_path, source)
    for args in (["--help"], ["replay", "--help"], ["trace", "x", "--backend", "nonesuch"]):
        done = tokenviz(env, *args)
        warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
        assert done.returncode == (2 if "nonesuch" in args else 0), (args, done.stderr)
        assert len(warnings) == 1 and "the backend plugin 'odd' of oddpkg is left out: " in warnings[0], done.stderr
        assert said in warnings[0] and "Traceback" not in done.stderr and "\x1b" not in done.stderr, done.stderr
    listed = done.stderr  # (trace went on to its own refusal, naming the built-ins whole)
    assert "the backends here are transformers, llama.cpp, server" in listed, listed


@pytest.mark.parametrize("option", OPTION_CLASHES)
def test_a_plugins_option_named_as_a_commands_own_is_left_out_and_the_built_in_kept(tmp_path, option):
    """An option named model, steps or temperature gave `ValueError: duplicate parameter name` on every
    command."""
    options = f"BackendOption({option!r}, 'mine', kind='number'),"
    env = install(tmp_path, BACKEND.format(name="odd", options=options, asked="return False"))
    done = tokenviz(env, "trace", "--help")
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    flag = "--" + option.replace("_", "-")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: the odd backend's option {flag} is left out: ")
    assert "trace" in warnings[0] and warnings[0].endswith(" an option of that name"), done.stderr
    assert f"{flag} " in tokenviz(env, "trace", "--help").stdout  # (the command's own, as it was)


def test_a_plugin_whose_asked_raises_is_one_line_when_its_option_is_given(tmp_path):
    options = "BackendOption('peak', 'the token that wins', kind='number'),"
    env = install(tmp_path, BACKEND.format(name="odd", options=options, asked="raise RuntimeError('no')"))
    assert tokenviz(env, "trace", "--help").returncode == 0
    done = tokenviz(env, "trace", "x", "--peak", "3")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and errors == ["error: the backend 'odd' failed on its options: no"], done.stderr
