"""The SAE libraries' own encode, run outside tokenviz: SAELens and EleutherAI's sparsify (eai-sparsify), in an
environment of their own, built once a machine (about a minute) beside the tests' own.

They bring some sixty packages (datasets, wandb, pandas, protobuf...) that the tests' environment must not
gain: protobuf alone changes how transformers converts a sentencepiece tokenizer. So they go into a venv of
their own whose `.pth` adds the tests' site-packages (torch, transformers and safetensors are the tests'
own, not installed again; pip never uninstalls outside its environment), and each encode is a process of
that venv reading and writing .npy files (`encode`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenviz.system.built_environment import ensure_built
from tokenviz.system.paths import cache_root

PINS = ("sae-lens==6.54.12", "eai-sparsify==1.3.3")
BUILD_TEST = "tests/features/test_sae_features.py::test_the_sae_libraries_environment_builds"
INSTALL_WITHIN_S = 1200
SCRIPT = Path(__file__).parent / "features" / "reference_encode.py"


class BuildFailed(Exception):
    pass


@dataclass(frozen=True)
class Built:
    python: Path | None  # the environment's python (None: not built)
    failure: str | None  # why it could not be built


def python_of(built: Built) -> Path:
    """The environment's python, or the test skipped naming the test that says why there is none."""
    if built.python is None:
        import pytest

        pytest.skip(f"the SAE libraries' environment could not be built (see {BUILD_TEST})")
    return built.python


def environment() -> Path:
    """Where the environment lives: one per tests' interpreter and pins."""
    site = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(json.dumps([site, sys.version, PINS]).encode()).hexdigest()[:12]
    return cache_root() / f"sae-reference-{key}"


def ensure() -> Path:
    """The environment's python, the libraries installed: built when missing, one process at a time."""
    venv = environment()
    python = str(venv / "bin" / "python")
    own = sysconfig.get_paths()
    seen = "\n".join(dict.fromkeys([own["purelib"], own["platlib"]]))  # the tests' packages, from the new venv
    site = "pathlib.Path(sysconfig.get_paths()['purelib'], 'tests-site.pth')"
    pth = f"import pathlib, sysconfig; {site}.write_text({seen!r})"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [python, "-c", pth],
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
    ]
    return ensure_built(venv, lambda: steps, " ".join(PINS), INSTALL_WITHIN_S, BuildFailed)


def encode(python: Path, library: str, folder: Path, residuals: np.ndarray, work: Path) -> np.ndarray:
    """`library`'s own encode ("sae_lens", "gemma_scope" through SAELens's JumpReLU as its Gemma Scope 2 loader
    maps the params, or "sparsify") of `residuals` (n, d_in) with the SAE in `folder`: (n, d_sae)."""
    given, out = work / "residuals.npy", work / "acts.npy"
    np.save(given, residuals.astype(np.float32))
    done = subprocess.run(
        [str(python), str(SCRIPT), library, str(folder), str(given), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)
