"""Every example in the README and under docs/ that shows what it prints (a ```console block: `$ tokenviz
...` lines, each followed by its output) runs as written, from a folder where docs/make_example_models.py
made the example models, and prints what the page shows: each shown line in order, a `...` in a line
standing for what the page leaves out (a machine's free memory, the columns a section is not about)."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from clitools import invoke

pytestmark = pytest.mark.bundled

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELIDED = "..."


@dataclass(frozen=True)
class Example:
    page: str
    command: str
    shown: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.page}:{self.command[:60]}"


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S):
            command, shown, lines = None, [], iter(block.splitlines())
            for line in lines:
                if line.startswith("$ "):
                    if command is not None:
                        found.append(Example(page.name, command, tuple(shown)))
                    command, shown = line[2:], []
                    while command.endswith("\\"):
                        command = command[:-1] + next(lines).strip()
                else:
                    shown.append(line.rstrip())
            if command is not None:
                found.append(Example(page.name, command, tuple(shown)))
    return found


EXAMPLES = examples()


def fits(shown: str, line: str) -> bool:
    """`line` prints what `shown` shows: its parts between `...`, in order (the whole line without one)."""
    if ELIDED not in shown:
        return line.rstrip() == shown
    at = 0
    for part in shown.split(ELIDED):
        found = line.find(part.strip(), at) if part.strip() else at
        if found < 0:
            return False
        at = found + len(part.strip())
    return True


def test_the_pages_hold_examples_that_show_their_output():
    assert len(EXAMPLES) >= 8 and {e.page for e in EXAMPLES} >= {"README.md", "headless.md", "big-models.md"}
    assert all(e.shown for e in EXAMPLES) and all(
        e.command.split()[0].endswith("tokenviz") for e in EXAMPLES if "=" not in e.command.split()[0]
    )


@pytest.fixture(scope="module")
def example_folder(tmp_path_factory) -> Path:
    """A folder as a reader's would be after `python docs/make_example_models.py`, with the docs' files."""
    folder = tmp_path_factory.mktemp("examples")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from make_example_models import main
    finally:
        sys.path.remove(str(ROOT / "docs"))
    main(folder)
    (folder / "docs").symlink_to(ROOT / "docs")
    return folder


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_an_example_prints_what_its_page_shows(example, example_folder, monkeypatch, capsys):
    words = shlex.split(example.command)
    while "=" in words[0]:  # VAR=value before the command
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    assert words[0].endswith("tokenviz"), example.command
    monkeypatch.chdir(example_folder)
    code, out, err = invoke(monkeypatch, capsys, *words[1:])
    refused = any(line.startswith("error:") for line in example.shown)  # (a refusal exits 2, as it says)
    assert code == (2 if refused else 0), err
    printed = [line.rstrip() for line in (out + err).splitlines()]
    at = 0
    for shown in example.shown:
        while at < len(printed) and not fits(shown, printed[at]):
            at += 1
        assert at < len(printed), f"{example.page}: `{example.command}` did not print {shown!r}:\n" + "\n".join(
            printed[-40:]
        )
        at += 1
