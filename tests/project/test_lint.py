"""The code's own checks run inside the test command, so CI enforces them: ruff's lint and format,
and mypy over the whole package and the benchmark (settings in pyproject.toml)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.xdist_group("mypy")  # (the module's tests share one mypy run: see mypy_run)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_ruff_lint_is_clean():
    out = run("ruff", "check", "tokenviz", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean():
    out = run("ruff", "format", "--check", "tokenviz", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def mypy_run() -> subprocess.CompletedProcess:
    """One mypy run for the module's tests (on one worker: the module is one xdist group). Its cache is
    kept in the user's cache, as pip keeps its wheels, not in the clone: a run after the first checks again
    only what changed (mypy compares each file's hash), 35 s cold on an idle 2-core machine and two minutes
    beside the other workers; one run at a time writes it."""
    from filelock import FileLock

    from tokenviz.system.paths import cache_root

    cache = cache_root() / "mypy"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache) + ".lock"):
        return run("mypy", "--cache-dir", str(cache))


def test_mypy_is_clean_over_the_whole_package(mypy_run):
    out = mypy_run
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
    checked = int(out.stdout.split("in ")[-1].split()[0])  # "... found in N source files"
    assert checked >= len(list((ROOT / "tokenviz").rglob("*.py")))  # every module, the UI and the CLI included


def test_mypy_strict_over_the_package_itself(mypy_run):
    """The run above is `mypy --strict` over the package, the torch and transformers code too: the
    configuration is strict and relaxes nothing for the package (its one override is the benchmark's),
    so a second run with --strict on the command line (55 s here) would check nothing more."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True and "tokenviz" in config["files"]
    for override in config.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        assert all(module.startswith("bench.") for module in modules), override
    assert mypy_run.returncode == 0 and "Success: no issues found" in mypy_run.stdout, mypy_run.stdout
