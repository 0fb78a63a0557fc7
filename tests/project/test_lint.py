"""The code's own checks run inside the test command, so CI enforces them: ruff's lint and format,
and mypy over the whole package and the benchmark (settings in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_ruff_lint_is_clean():
    out = run("ruff", "check", "tokenviz", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean():
    out = run("ruff", "format", "--check", "tokenviz", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_clean_over_the_whole_package():
    out = run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
    checked = int(out.stdout.split("in ")[-1].split()[0])  # "... found in N source files"
    assert checked >= len(list((ROOT / "tokenviz").rglob("*.py")))  # every module, the UI and the CLI included


def test_mypy_strict_over_the_package_itself():
    """--strict on the command line, whatever the configuration relaxes: the torch and transformers code too."""
    out = run("mypy", "--strict", "tokenviz")
    assert out.returncode == 0 and "Success: no issues found" in out.stdout, out.stdout + out.stderr
