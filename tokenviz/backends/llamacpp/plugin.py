"""The llama.cpp backend as a plugin (contract.backend): `--backend llama.cpp` steps a GGUF (--model
FILE.gguf, ollama:NAME[:TAG], or the bundled model) in llama.cpp in this process, in its own
quantization. Imports nothing heavy: the command line is built from it before anything loads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tokenviz.backends.llamacpp.refusals import NO_ABLATION
from tokenviz.backends.llamacpp.runtime import FLASH_ATTENTION, kv_bytes_a_position
from tokenviz.contract.backend import WITH_COMPARE, BackendOption, OpenEngine, Opening, Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import HeadAblation
from tokenviz.contract.text import safe_text
from tokenviz.files.gguf_header import GgufHeader
from tokenviz.system.cpu_threads import THREADS_A_CORE, too_many
from tokenviz.system.ollama import PREFIX, ollama_gguf
from tokenviz.system.paths import BUNDLED_NAME, bundled_gguf

if TYPE_CHECKING:
    from tokenviz.backends.llamacpp.engine import LlamaCppEngine

CONTEXT = 4096  # tokens llama.cpp's context holds unless --context says (at most what the model was trained on)


class LlamaCppBackend:
    name = "llama.cpp"
    about = "a GGUF in llama.cpp in this process, in its own quantization (llama-cpp-python)"
    weights_here, draws = True, False
    options = (
        BackendOption(
            "context",
            f"With --backend llama.cpp: the tokens its context holds (default {CONTEXT:,}, at most the model's).",
            kind="number",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "gpu_layers",
            "With --backend llama.cpp: the layers offloaded to the GPU (default 0: all on the CPU; llama-cpp-python "
            "must be built for the GPU).",
            kind="number",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "flash_attention",
            "With --backend llama.cpp: flash attention auto (llama.cpp's default: on for a CPU), on or off "
            "(llama-cpp-python's Llama runs it off unless asked); it moves a probability by up to 0.04.",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "threads",
            "With --backend llama.cpp: the CPU threads it computes with (default: OMP_NUM_THREADS where set, "
            f"else every core; at most {THREADS_A_CORE} a core).",
            kind="number",
            commands=WITH_COMPARE,
        ),
    )

    def asked(self, given: frozenset[str]) -> bool:
        return False  # --backend llama.cpp chooses it: its options alone do not

    def loader(self, opening: Opening) -> OpenEngine:
        """The GGUF named (checked to be a GGUF file, to fit in memory) loads in the worker's thread."""
        model = opening.model
        for ablation in (i for i in opening.interventions if isinstance(i, HeadAblation)):
            raise TokenvizError(f"{ablation.label}: {NO_ABLATION}")
        numbers = {name: opening.number(name) for name in ("context", "gpu_layers", "threads")}
        for name, value in numbers.items():
            if (value is not None and not 0 <= value <= (1 << 24)) or (name != "gpu_layers" and value == 0):
                raise TokenvizError(f"--{name.replace('_', '-')} {value}: give a whole number from 1")
        threads = numbers["threads"]
        if threads and (why := too_many(threads)):
            raise TokenvizError(f"--threads {threads:,}: {why}")
        flash = opening.text("flash_attention")
        flash = FLASH_ATTENTION[0] if flash is None else flash
        if flash not in FLASH_ATTENTION:
            raise TokenvizError(f"--flash-attention {safe_text(flash)!r}: give {', '.join(FLASH_ATTENTION)}")
        path, header = gguf_path(model)
        context = numbers["context"] or CONTEXT
        fits(path, header, context)

        def load(progress: Progress) -> LlamaCppEngine:
            from tokenviz.backends.llamacpp.engine import LlamaCppEngine
            from tokenviz.backends.llamacpp.runtime import Runtime

            progress(f"loading {path.name} in llama.cpp", None)
            runtime = Runtime(path, context, numbers["gpu_layers"] or 0, threads, flash)
            return LlamaCppEngine(runtime, path, shown_name(model, path), header)

        return load


def shown_name(model: str | None, path: Path) -> str:
    """How the model view names the model: the bundled one, Ollama's name as typed, or the file's name."""
    if model is None:
        return BUNDLED_NAME
    return model if model.startswith(PREFIX) else path.name


def fits(path: Path, header: GgufHeader, context: int) -> None:
    """Refuse, before llama.cpp loads it, a GGUF whose weights and KV cache at `context` tokens pass the
    memory available (as the transformers backend refuses a model that does not fit)."""
    import psutil

    arch = header.strings.get("general.architecture", "llama")
    layers = header.number(f"{arch}.block_count") or 0
    heads = header.number(f"{arch}.attention.head_count") or 1
    kv_heads = header.number(f"{arch}.attention.head_count_kv") or heads
    width = header.number(f"{arch}.embedding_length") or 0
    head_dim = header.number(f"{arch}.attention.key_length") or width // max(heads, 1)
    trained = header.number(f"{arch}.context_length") or context
    value_dim = header.number(f"{arch}.attention.value_length") or head_dim
    kv = min(context, trained) * kv_bytes_a_position(layers, kv_heads, head_dim, value_dim)
    weights, available = path.stat().st_size, psutil.virtual_memory().available
    if weights + kv > available:
        raise TokenvizError(
            f"{path.name} needs about {(weights + kv) / 2**30:.1f} GB (its weights {weights / 2**30:.1f} GB, its "
            f"KV cache at {min(context, trained):,} tokens {kv / 2**30:.1f} GB); {available / 2**30:.1f} GB is "
            "available: a smaller --context, or a smaller GGUF"
        )


def gguf_path(model: str | None) -> tuple[Path, GgufHeader]:
    """The GGUF file --model names (None: the bundled one), its header checked (files.gguf_header)."""
    from tokenviz.files.gguf_header import read_gguf_header

    if model is None:
        return bundled_gguf(), read_gguf_header(bundled_gguf())
    if model.startswith(PREFIX):
        path = ollama_gguf(model)
        return path, read_gguf_header(path)
    path = Path(model).expanduser()
    if not path.name.endswith(".gguf"):
        raise TokenvizError(f"--model {model}: the llama.cpp backend runs a GGUF file (--model FILE.gguf)")
    if not path.is_file():
        raise TokenvizError(f"--model {model}: {'not a regular file' if path.exists() else 'no such file'}")
    return path, read_gguf_header(path)  # a header that lies is one line here, before llama.cpp reads it


BACKEND = LlamaCppBackend()
