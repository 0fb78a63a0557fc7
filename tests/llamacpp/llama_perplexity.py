"""llama.cpp's own llama-perplexity, built from the llama.cpp sources vendored in the pinned
llama-cpp-python sdist (the package index's: the same llama.cpp tokenviz runs), with CMake and the
machine's compiler: about 4 minutes on 2 cores, once a machine (the binary is kept under the user's cache,
in a folder named by the pin and this file; the sources and the build are removed once it is made). A
file lock keeps the test workers from building it twice.

One line is added to its source: the log flushed before it returns. Its log is written by a thread of its
own, which exit can cut short, losing the statistics it prints last (llama.cpp#22142: "logs may be lost if
not flushed before the program exits"); on a busy machine they were lost.

`kl_divergence` runs it as its users do: `--kl-divergence-base FILE` over the base model writes the base's
log-probabilities, then `--kl-divergence` over the quantized model prints the statistics."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from filelock import FileLock
from llama_reference import THREADS, pin

from tokenviz.backends.llamacpp.runtime import amx_present

BUILD_S = 3600  # the most a build may take
BINARY = "llama-perplexity"


ENDING = "    llama_backend_free();\n\n    return 0;\n}"  # the end of its main, where the log is flushed


def folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]
    return cache / "tokenviz-tests" / "llama-perplexity" / f"{pin().replace('==', '-')}-{recipe}"


def cmake() -> str:
    """CMake: the test environment's (the `cmake` package), else the machine's."""
    own = Path(sys.executable).parent / "cmake"
    found = str(own) if own.exists() else shutil.which("cmake")
    if found is None:
        raise RuntimeError("no CMake here: pip install cmake (the test extra has it)")
    return found


def _run(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=BUILD_S)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}); its last lines:\n{tail}")


def build() -> Path:
    """The llama-perplexity binary, built once a machine (a RuntimeError with the build's last lines)."""
    home = folder()
    binary = home / BINARY
    if binary.exists():
        return binary
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(home / "build.lock"):
        if binary.exists():
            return binary
        work = home / "work"
        shutil.rmtree(work, ignore_errors=True)
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", pin(), "-d", str(work)]
        )
        (archive,) = work.glob("*.tar.gz")
        sources = work / "llama.cpp"
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                inside = member.name.split("/vendor/llama.cpp/", 1)
                if len(inside) == 2 and (member.isfile() or member.isdir()):
                    member.name = inside[1]
                    tar.extract(member, sources, filter="data")
        main = sources / "tools" / "perplexity" / "perplexity.cpp"
        code = main.read_text()
        if code.count(ENDING) != 1:
            raise RuntimeError(f"{main.name} of {pin()} does not end as this build expects: see llama_perplexity.py")
        main.write_text(
            code.replace(
                ENDING, ENDING.replace("    return 0;", "    common_log_flush(common_log_main());\n    return 0;")
            )
        )
        options = {
            "CMAKE_BUILD_TYPE": "Release",
            "BUILD_SHARED_LIBS": "OFF",  # one binary, kept alone
            "LLAMA_CURL": "OFF",
            "LLAMA_OPENSSL": "OFF",
            "LLAMA_BUILD_TESTS": "OFF",
            "LLAMA_BUILD_EXAMPLES": "OFF",
            "LLAMA_BUILD_SERVER": "OFF",
            "LLAMA_BUILD_TOOLS": "ON",
            "GGML_CCACHE": "OFF",
        }
        _run([cmake(), "-S", str(sources), "-B", str(work / "build"), *(f"-D{k}={v}" for k, v in options.items())])
        _run([cmake(), "--build", str(work / "build"), "--target", BINARY, "-j", str(os.cpu_count() or 1)])
        shutil.copy2(work / "build" / "bin" / BINARY, home / f"{BINARY}.part")
        (home / f"{BINARY}.part").rename(binary)
        shutil.rmtree(work, ignore_errors=True)
    return binary


def kl_divergence(binary: Path, base: Path, model: Path, text: Path, window: int, out: Path) -> str:
    """llama-perplexity's statistics of `model` against `base` over `text` in windows of `window` tokens,
    each window one batch (-b as large), as it prints them."""
    common = ["-f", str(text), "-c", str(window), "-b", str(window), "-t", str(THREADS)]
    if amx_present():  # as tokenviz runs llama.cpp there: its AMX kernel crashes on Q4_1 (runtime.amx_present)
        common.append("--no-repack")  # (llama.cpp's switch for its extra buffer types, repacking and AMX)
    common.append("--kl-divergence-base")
    _run([str(binary), "-m", str(base), *common, str(out)])
    done = subprocess.run(
        [str(binary), "-m", str(model), *common, str(out), "--kl-divergence"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


FIGURES = {  # llama-perplexity's printed line: the statistic's name in tokenviz's document, and its scale
    r"Mean PPL\(Q\)\s+:": ("ppl_q", 1),
    r"Mean PPL\(base\)\s+:": ("ppl_base", 1),
    r"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):": ("correlation", 100),
    r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s+:": ("ln_ppl_ratio", 1),
    r"Mean PPL\(Q\)/PPL\(base\)\s+:": ("ppl_ratio", 1),
    r"Mean\s+KLD:": ("mean_kld", 1),
    r"Maximum KLD:": ("max_kld", 1),
    r"99\.9%\s+KLD:": ("kld_p99.9", 1),
    r"99\.0%\s+KLD:": ("kld_p99", 1),
    r"Median\s+KLD:": ("median_kld", 1),
    r" 1\.0%\s+KLD:": ("kld_p1", 1),
    r"Minimum KLD:": ("min_kld", 1),
    r"Mean\s+Δp:": ("mean_dp", 100),
    r"Maximum Δp:": ("max_dp", 100),
    r"Median\s+Δp:": ("median_dp", 100),
    r"Minimum Δp:": ("min_dp", 100),
    r"RMS Δp\s+:": ("rms_dp", 100),
    r"Same top p:": ("same_top_p", 100),
}


def printed(output: str) -> dict[str, tuple[float, int]]:
    """Each statistic llama-perplexity printed: (its value, scaled to tokenviz's, and its decimals)."""
    found = {}
    for label, (name, scale) in FIGURES.items():
        match = re.search(rf"^{label}\s*(-?[0-9.]+)", output, re.MULTILINE)
        assert match, f"llama-perplexity printed no {label!r}:\n{output[-3000:]}"
        text = match.group(1)
        decimals = len(text.split(".")[1]) if "." in text else 0
        found[name] = (float(text) / scale, decimals + (2 if scale == 100 else 0))
    return found
