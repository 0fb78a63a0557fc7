"""What a user's process imports: `tokenviz replay FILE` never imports torch or transformers, and
`tokenviz` paints its first frame before it does (the engine thread imports them afterwards)."""

import json
import subprocess
import sys

import pytest
from apptools import frozen_recording

from tokenviz.files.journey_file import save_journey

# Runs the command line in a fresh interpreter; the app runs headless for a moment instead of
# taking over the terminal, and the probe reports what had been imported at its first frame.
PROBE = """
import asyncio, json, sys
from tokenviz.ui.app import TokenvizApp

seen = {}
mount = TokenvizApp.on_mount

def on_mount(self):
    seen["at_first_frame"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    mount(self)

def run(self, *args, **kwargs):
    async def briefly():
        async with self.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            seen["chips"] = len(self.journey.snapshot.chips) if self.journey.snapshot else 0
    asyncio.run(briefly())

TokenvizApp.on_mount = on_mount
TokenvizApp.run = run
sys.argv = ["tokenviz", *sys.argv[1:]]
from tokenviz.cli.commands import in_terminal
in_terminal.QUIT_WAIT_S = 60  # let the engine thread finish loading, so the process ends normally
in_terminal.require_terminal = lambda *headless: None  # the app runs headless here
def exit_now(code):
    raise SystemExit(code)
in_terminal.exit_now = exit_now  # end as a test can see, not at once
from tokenviz.cli import run as main
try:
    main()
except SystemExit:
    pass
seen["at_exit"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(json.dumps(seen))
"""


def probe(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def journey_path(tmp_path_factory):
    return str(save_journey(tmp_path_factory.mktemp("replay") / "journey.json", *frozen_recording(steps=3)))


def test_replay_imports_no_torch_from_start_to_exit(journey_path):
    seen = probe("replay", journey_path)
    assert seen["chips"] > 0  # the recording was on screen
    assert seen["at_first_frame"] == [] and seen["at_exit"] == []


def test_the_app_paints_its_first_frame_before_importing_torch(tmp_path):
    seen = probe("--model", str(tmp_path / "nowhere"))
    assert seen["at_first_frame"] == []


REFUSAL_PROBE = """
import atexit, sys
atexit.register(lambda: print("IMPORTED-TORCH" if "torch" in sys.modules else "NO-TORCH", file=sys.stderr))
sys.argv = ["tokenviz", *sys.argv[1:]]
from tokenviz.cli import run
run()
"""


@pytest.mark.parametrize(
    "args, said",
    [
        (["trace", "Hi", "--beams", "9"], "--beams must be 2 to 8"),
        (["trace", "Hi", "--save", "{existing}"], "exists already"),
        (["trace", "Hi", "--html", "{existing}"], "exists already"),
        (["trace", "Hi", "--steps", "0"], "--steps must be at least 1"),
        (["trace", "Hi", "--attribution", "magic"], "--attribution must be loo or grad"),
        (["trace", "Hi", "--beams", "3", "--speculate", "prompt-lookup"], "not both"),
        (["compare", "Hi", "--against", "temperature=-1"], "temperature"),
        (["trace", "Hi", "--max-memory", "cpu=lots"], "is not a size"),
        (["Hi", "--max-memory", "gpu=2GB"], "write DEVICE=SIZE"),
        (["trace", "Hi", "--device-map", "everywhere"], "--device-map must be"),
    ],
)
def test_a_bad_option_is_refused_before_torch_is_imported(tmp_path, args, said):
    existing = tmp_path / "journey.json"
    existing.write_text("{}")
    args = [a.replace("{existing}", str(existing)) for a in args]
    out = subprocess.run([sys.executable, "-c", REFUSAL_PROBE, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert said in lines[0] and lines[-1] == "NO-TORCH", out.stderr
