"""Threads are bounded by what the machine can run: --threads of 100,000 ended llama.cpp in
std::bad_alloc, and OMP_NUM_THREADS=² in a ValueError traceback."""

import os
import subprocess
import sys

import pytest

from tokenviz.backends.llamacpp.runtime import default_threads
from tokenviz.system.cpu_threads import THREADS_A_CORE, cores, most_threads, tidy_thread_setting, told_threads


@pytest.mark.parametrize("threads", ["100000", "16777216"])
def test_more_threads_than_the_machine_runs_is_one_line_and_exit_2(threads):
    command = [sys.executable, "-m", "tokenviz", "trace", "x", "--backend", "llama.cpp", "--threads", threads]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"--threads {int(threads):,}: this machine runs at most {most_threads():,}" in errors[0]


@pytest.mark.parametrize("told", ["²", "x", "-3", "0", "1e3", str(10**12), "9" * 5000, str(most_threads() + 1)])
def test_a_junk_or_huge_omp_num_threads_is_ignored_with_one_line(told):
    environ = {"OMP_NUM_THREADS": told}
    said: list[str] = []
    assert told_threads(environ) is None
    tidy_thread_setting(said.append, environ)
    assert "OMP_NUM_THREADS" not in environ and len(said) == 1 and "is ignored" in said[0], said


def test_a_sound_omp_num_threads_is_kept_and_followed(monkeypatch):
    environ = {"OMP_NUM_THREADS": " 1 "}
    said: list[str] = []
    tidy_thread_setting(said.append, environ)
    assert environ == {"OMP_NUM_THREADS": " 1 "} and not said
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "²")
    assert default_threads() == cores() and most_threads() == THREADS_A_CORE * cores()


def test_the_command_line_says_so_and_goes_on():
    command = [sys.executable, "-m", "tokenviz", "trace", "x", "--backend", "nonesuch"]
    env = {**os.environ, "OMP_NUM_THREADS": "²"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr and done.returncode == 2, done.stderr
    assert lines[0] == "warning: OMP_NUM_THREADS=\\xb2 is ignored: not a whole number of threads from 1", lines
