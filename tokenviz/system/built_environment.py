"""A virtual environment built by a list of commands, once, one process at a time: the vLLM server's (and the
tests' SAE libraries'). A mark written last says what was built, so an interrupted build is built again."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

READY_MARK = "tokenviz-ready"  # written last into the environment: what was built, complete


def as_shell(steps: list[list[str]]) -> str:
    """The commands as one shell line, to run by hand."""
    return " && ".join(" ".join(step) for step in steps)


def ensure_built(
    venv: Path,
    steps: Callable[[], list[list[str]]],
    built: str,
    within_s: float,
    error: type[Exception],
    say: Callable[[str], None] = lambda line: None,
    by_hand: bool = False,
) -> Path:
    """The environment's python, built by the commands `steps()` gives where its mark is not `built`;
    `error` with the failing command's last lines (and with `by_hand`, the commands to run by hand) where a
    step fails or takes over `within_s`."""
    python, ready = venv / "bin" / "python", venv / READY_MARK
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv) + ".lock"):
        if python.exists() and ready.exists() and ready.read_text() == built:
            return python
        ready.unlink(missing_ok=True)
        commands = steps()
        hand = f"\nby hand: {as_shell(commands)}" if by_hand else ""
        for step in commands:
            say(" ".join(step[-3:]))
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=within_s)
            except subprocess.TimeoutExpired:
                raise error(f"building {venv} took over {within_s:g} s{hand}") from None
            if done.returncode != 0:
                last = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
                raise error(f"building {venv} failed at `{' '.join(step)}`:\n{last}{hand}")
        ready.write_text(built)
    return python
