"""The layers of docs/ARCHITECTURE.md, checked with the tools: import-linter's contracts, no import cycle, and a
fresh interpreter for what the first frame and `tokenviz replay` import."""

import subprocess
import sys
from pathlib import Path

import grimp
import networkx

ROOT = Path(__file__).parents[2]


def test_import_linter_contracts_hold():
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports('pyproject.toml'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 broken" in out.stdout


def test_every_backend_package_is_held_independent_of_the_others():
    """Each package under tokenviz/backends/ that is a backend (not the shared code, not the registry) is in
    the independence contract, so a new backend cannot import another without a broken contract."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    independent = next(c["modules"] for c in contracts if c["type"] == "independence")
    packages = {p.parent.name for p in (ROOT / "tokenviz" / "backends").glob("*/__init__.py")} - {"shared"}
    assert set(independent) == {f"tokenviz.backends.{name}" for name in packages}
    graph = grimp.build_graph("tokenviz", exclude_type_checking_imports=False)
    for name in packages:
        for other in packages - {name}:
            assert not graph.chain_exists(f"tokenviz.backends.{name}", f"tokenviz.backends.{other}", as_packages=True)


def test_no_import_cycle_anywhere_type_checking_imports_included():
    graph = grimp.build_graph("tokenviz", exclude_type_checking_imports=False)  # (a hint's import is design too)
    edges = networkx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            edges.add_edge(module, imported)
    cycles = list(networkx.simple_cycles(edges))
    assert cycles == []


def modules_after(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported after running `code`."""
    probe = code + "\nimport sys\nprint('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(out.stdout.split())


def test_the_ui_render_files_and_contract_layers_import_no_torch():
    loaded = modules_after(
        "import tokenviz.ui.app, tokenviz.files.journey_file, tokenviz.files.documents, "
        "tokenviz.render.heatmap, tokenviz.worker.recording, tokenviz.worker.engine_thread, tokenviz.worker.comparing, "
        "tokenviz.contract.worker"
    )
    assert not loaded & {"torch", "transformers"}


def test_layers_below_the_ui_import_no_textual():
    loaded = modules_after(
        "import tokenviz.worker.engine_thread, tokenviz.journey.session, tokenviz.backends.transformers.beams, "
        "tokenviz.backends.transformers.speculation, tokenviz.backends.transformers.lens, tokenviz.files.journey_file, "
        "tokenviz.render.heatmap, tokenviz.worker.snapshots"
    )
    assert "textual" not in loaded
