"""Reading a journey costs what the file costs (issue 24): a file of many bad numbers makes one
error, not one per number; a file too large to parse within READ_MEMORY is refused before it is
parsed. Each read runs in a child whose address space is limited to what it had after its imports
plus 1 GB, so a regression ends that child (MemoryError), not the machine."""

import copy
import json
import subprocess
import sys

import pytest
from clitools import invoke
from test_hostile_files import VALID, one_error

from tokenviz.contract.errors import TokenvizError
from tokenviz.files import atomic
from tokenviz.files.journey_file import open_journey

# The peak is the kernel's high-water mark of the child's own memory (VmHWM): getrusage's ru_maxrss
# would start from the test run's peak, which a child spawned by vfork inherits, and hide the growth.
CHILD = """
import json, resource, sys
from pathlib import Path
from tokenviz.contract.errors import TokenvizError
from tokenviz.files.journey_file import open_journey
def status_kb(field):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
    return int(line.split()[1])
limit = status_kb("VmSize:") * 1024 + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
before = status_kb("VmRSS:")
try:
    open_journey(sys.argv[1])
    outcome = "accepted"
except TokenvizError as exc:
    outcome = str(exc)
grown = status_kb("VmHWM:") - before
print(json.dumps({"outcome": outcome, "grown_mb": grown / 1024}))
"""


def read_in_a_child(path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]  # (a MemoryError would end it with a traceback)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_journey_full_of_out_of_range_numbers_is_refused_within_1_gb(tmp_path):
    doc = copy.deepcopy(VALID)
    doc["replay"]["records"][0]["decision"]["raw_probs"] = [2.0] * 800_000  # about 4 MB of them
    path = tmp_path / "out-of-range.json"
    path.write_text(json.dumps(doc))
    assert path.stat().st_size > 4_000_000
    read = read_in_a_child(path)
    assert "damaged at replay.records.0.decision.raw_probs" in read["outcome"]
    assert read["grown_mb"] < 200  # it cost 1.84 GB before: one error object per bad number


@pytest.mark.parametrize("field", ["top", "input_ids", "prompt_predictions"])
def test_every_list_has_a_bound_and_stops_at_its_first_bad_element(tmp_path, field):
    doc = copy.deepcopy(VALID)
    doc["replay"]["records"][0][field] = [-1] * 200_000
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenvizError, match=f"damaged at replay.records.0.{field}"):
        open_journey(path)


def test_a_64_mb_unknown_key_is_read_within_1_gb_and_a_larger_one_refused_before_parsing(tmp_path):
    for numbers, accepted in ((12_000_000, True), (24_000_000, False)):
        path = tmp_path / f"unknown-{numbers}.json"
        unknown = ("1.5, " * numbers)[:-2]  # (json.dumps of [1.5] * numbers, without building the list)
        path.write_text(json.dumps(VALID)[:-1] + f', "unknown": [{unknown}]}}')
        read = read_in_a_child(path)
        if accepted:
            assert read["outcome"] == "accepted" and read["grown_mb"] < 1024
        else:
            assert "would take about" in read["outcome"] and "tokenviz reads journeys within" in read["outcome"]
            assert read["grown_mb"] < 100  # refused from one pass over the file: nothing was built


def test_a_lone_surrogate_is_refused_and_no_write_fails_on_one(tmp_path, monkeypatch, capsys):
    doc = copy.deepcopy(VALID)
    doc["replay"]["prompt_text"] = "the \ud800 prompt"
    path = tmp_path / "surrogate.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenvizError, match=r"replay\.prompt_text: the text is not valid Unicode"):
        open_journey(path)
    code, _, err = invoke(monkeypatch, capsys, "replay", str(path))
    assert code == 2 and "not valid Unicode" in one_error(err)
    with pytest.raises(TokenvizError, match="its text is not valid Unicode"):  # every write refuses it in one line
        atomic.write_file(tmp_path / "out.svg", "<svg>\ud800</svg>")
    assert not (tmp_path / "out.svg").exists() and not list(tmp_path.glob(".out.svg.*"))


def test_a_5000_digit_integer_gets_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    text = json.dumps(VALID).replace('"kv_len": ', '"kv_len": ' + "9" * 5000 + "0 * ", 1).replace("0 * ", "", 1)
    path = tmp_path / "long.json"
    path.write_text(text)
    code, _, err = invoke(monkeypatch, capsys, "replay", str(path))
    line = one_error(err)
    assert code == 2 and "cannot be read" in line and "4300 digits" in line and "sys.set_int" not in line


def test_written_files_follow_the_umask_as_open_would(tmp_path):
    written = atomic.write_file(tmp_path / "shared.json", "{}")
    assert written.stat().st_mode & 0o777 == atomic.FILE_MODE
    umask = atomic._umask()
    assert written.stat().st_mode & 0o777 == 0o666 & ~umask  # 0644 under the usual 022
