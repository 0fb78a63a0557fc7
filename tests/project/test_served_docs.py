"""The served model's page is one set of conventions (issue 69, finding 25): it leads with start_vllm,
shows the lines it prints as it prints them, and every later command runs against that server as
written (its port, its key's variable, the model directory for the lens and attention rows)."""

from __future__ import annotations

import re
from pathlib import Path

from tokenviz.cli.start_vllm import KEY_VARIABLE, paste_lines

PAGE = (Path(__file__).parents[2] / "docs" / "big-models.md").read_text()
SERVED = PAGE[PAGE.index("## A model on a server") :]
PORT = 8000


def commands() -> list[str]:
    """Each tokenviz command of the section's code blocks, its continued lines joined."""
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", SERVED, re.S)
    lines = " ".join(blocks).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip().startswith("tokenviz ")]


def test_the_section_starts_the_server_with_start_vllm_and_shows_its_lines_as_printed():
    first_block = re.search(r"```bash\n(.*?)```", SERVED, re.S).group(1)
    assert first_block.strip() == f".venv/bin/python -m tokenviz.cli.start_vllm --port {PORT}"
    export, run = paste_lines(
        PORT, "3f1c…", Path("/home/you/.cache/tokenviz/models/SmolLM2-135M-Instruct.Q4_1-0123456789ab")
    )
    assert f"    {export}\n    {run}\n" in SERVED


def test_every_served_command_runs_against_that_server_as_written():
    found = commands()
    assert len(found) >= 4, found
    for command in found:
        assert f"--endpoint http://127.0.0.1:{PORT}/v1" in command, command
        assert f"--api-key-env {KEY_VARIABLE}" in command, command
        if "--lens" in command or "--attention" in command or command.startswith('tokenviz "'):
            assert "--tokenizer " in command, command  # (the lens and attention rows read the head there)
