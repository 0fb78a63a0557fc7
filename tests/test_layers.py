"""DESIGN.md's layers: the core never imports textual; the UI never holds torch tensors."""

import subprocess
import sys
from pathlib import Path

CORE = ["tokenviz.engine", "tokenviz.sampling", "tokenviz.session", "tokenviz.records", "tokenviz.render.heatmap",
        "tokenviz.render.bars", "tokenviz.render.pieces", "tokenviz.render.attention", "tokenviz.render.columns",
        "tokenviz.render.colors", "tokenviz.bridge", "tokenviz.controls", "tokenviz.trace"]


def test_core_modules_never_import_textual():
    code = (
        "import sys\n"
        f"for m in {CORE!r}: __import__(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_linter_contract_holds():
    root = Path(__file__).parent.parent
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename='pyproject.toml'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_ui_modules_never_import_torch_directly():
    root = Path(__file__).parent.parent / "tokenviz"
    for path in [root / "app.py", *sorted((root / "widgets").glob("*.py"))]:
        text = path.read_text()
        assert "import torch" not in text, path
