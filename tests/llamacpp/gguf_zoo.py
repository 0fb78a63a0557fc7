"""GGUFs made as people's downloads are made: a tiny random-weight model of each family llama.cpp runs,
converted by llama.cpp's own convert_hf_to_gguf.py and gguf-py (from the llama-cpp-python sdist of the
pinned version: the same llama.cpp) and quantized by llama.cpp's own quantizer (llama_model_quantize, as
llama-quantize does).

Rows are 256 wide (the hidden size and every feed-forward width are multiples of 256), so a K-quant is
never replaced by a fallback type as it is on the bundled model's 576-wide rows. The vocabulary is the
bundled model's own (SmolLM2's, 49,152 tokens) where the family's converter takes a GPT-2-style tokenizer,
else a sentencepiece model trained here (gemma2 and phi3 read only a tokenizer.model).

Made once a machine: the sources and the GGUFs are kept under the user's cache, in a folder named by a
hash of this file, the pin and the libraries that make the weights, so a change to any of them makes them
again (a file lock keeps the test workers from making one twice); an earlier zoo left a day is removed."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock
from llama_reference import PROMPT, THREADS, pin

QUANTS = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS")
SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
}
HYBRID = ["sliding_attention", "full_attention"] * 2
WINDOW = 4  # shorter than the prompt and the steps, so the window matters
SENTENCEPIECE_VOCAB = 1024


@dataclass(frozen=True)
class Family:
    config: dict = field(default_factory=dict)  # beyond SHAPE
    sentencepiece: bool = False  # its converter reads a tokenizer.model alone
    # The pre-tokenizer named in the GGUF where the converter cannot tell it by its hash: qwen2's loads
    # the bundled vocabulary as transformers' Qwen2Tokenizer (the model type chooses it), with Qwen2's own
    # pre-tokenizer, which llama.cpp calls "qwen2".
    pre: str | None = None


FAMILIES = {
    "llama": Family(),
    "qwen2": Family(pre="qwen2"),
    "qwen3": Family(),
    "mistral": Family({"sliding_window": WINDOW}),
    "gemma2": Family({"sliding_window": WINDOW, "layer_types": HYBRID}, sentencepiece=True),  # soft-capping
    "gemma3_text": Family({"sliding_window": WINDOW, "layer_types": HYBRID}),
    "phi3": Family({"head_dim": None}, sentencepiece=True),
    "granite": Family({"logits_scaling": 4.0, "embedding_multiplier": 2.0, "residual_multiplier": 0.5}),
    "olmo2": Family(),
    "qwen2_moe": Family(
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 512,
        }
    ),
    # (llama.cpp reads OLMoE's query and key norms as wide as the hidden size, as OLMoE has no grouped heads)
    "olmoe": Family({"num_experts": 4, "num_experts_per_tok": 2, "num_key_value_heads": 4}),
}


def zoo_folder() -> Path:
    """This machine's zoo: the user's cache, in a folder named by what makes its files."""
    import torch
    import transformers

    made_by = Path(__file__).read_bytes() + f"{pin()} {transformers.__version__} {torch.__version__}".encode()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tokenviz-tests" / "gguf-zoo" / hashlib.sha256(made_by).hexdigest()[:16]


STALE_S = 24 * 3600  # a zoo of another hash untouched this long is an earlier version's (about 1.7 GB)


def prune_stale(folder: Path) -> None:
    """Remove the zoos beside `folder` that no run has touched for STALE_S (one in use is touched as its
    files are made; a younger one may be another checkout's, running now)."""
    for other in folder.parent.iterdir():
        try:
            if other != folder and other.is_dir():
                touched = max((p.stat().st_mtime for p in other.rglob("*")), default=other.stat().st_mtime)
                if time.time() - touched > STALE_S:
                    shutil.rmtree(other, ignore_errors=True)
        except FileNotFoundError:  # (removed meanwhile by another worker)
            continue


def llama_cpp_sources(folder: Path) -> Path:
    """The vendored llama.cpp's converter and gguf-py from the pinned llama-cpp-python sdist (the package
    index's; about 77 MB, of which the few MB the converter needs are kept)."""
    sources = folder / "llama.cpp"
    if (sources / "convert_hf_to_gguf.py").exists():
        return sources
    download = folder / "sdist"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", pin(), "-d", str(download)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    (archive,) = download.glob("*.tar.gz")
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            inside = member.name.split("/vendor/llama.cpp/", 1)
            if len(inside) == 2 and inside[1].startswith(wanted) and (member.isfile() or member.isdir()):
                member.name = inside[1]
                tar.extract(member, folder / "llama.cpp.part", filter="data")
    (folder / "llama.cpp.part").rename(sources)
    for leftover in download.iterdir():
        leftover.unlink()
    return sources


def bundled_tokenizer():
    """The bundled GGUF's tokenizer as transformers reads it (SmolLM2's)."""
    from transformers import AutoTokenizer

    from tokenviz.system.paths import bundled_gguf

    gguf = bundled_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def sentencepiece_model() -> bytes:
    """A byte-fallback BPE sentencepiece model trained on words of the bundled vocabulary (and the tests'
    prompt), with Gemma's special ids (pad 0, eos 1, bos 2, unk 3) and Phi-3's <|endoftext|> (llama.cpp
    looks it up by its text in a phi3 GGUF)."""
    import sentencepiece

    tokenizer = bundled_tokenizer()
    words = [tokenizer.decode([i]).strip() for i in range(2000, 12000)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)] + [PROMPT + " Paris, France."]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=SENTENCEPIECE_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        user_defined_symbols=["<|endoftext|>"],
        minloglevel=2,
    )
    return model.getvalue()


def save_model(name: str, family: Family, folder: Path) -> None:
    """The family's tiny model with random weights (seed 0) and its tokenizer, as transformers saves them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {**SHAPE, **family.config}
    if family.sentencepiece:
        (folder / "tokenizer.model").write_bytes(sentencepiece_model())
        config.update(vocab_size=SENTENCEPIECE_VOCAB, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    else:
        tokenizer = bundled_tokenizer()
        tokenizer.save_pretrained(folder)
        config.update(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        config.update(bos_token_id=tokenizer.bos_token_id, pad_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(name, **{k: v for k, v in config.items() if v is not None})
    )
    with torch.no_grad():  # a greedy run lasts the tests' steps: the end token's head row is zero, a logit
        model.get_output_embeddings().weight[config["eos_token_id"]] = 0  # that random weights rarely top
    model.save_pretrained(folder)


CONVERT = """
import runpy, sys
sources, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [sources, sources + "/gguf-py"]  # (before the package index's gguf: the same llama.cpp)
if pre:
    from conversion.base import TextModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [sources + "/convert_hf_to_gguf.py", *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(sources: Path, model: Path, out: Path, pre: str | None) -> None:
    """llama.cpp's own convert_hf_to_gguf.py on the saved model, to F16."""
    command = [sys.executable, "-c", CONVERT, str(sources), pre or "", str(model), "--outfile", str(out)]
    done = subprocess.run([*command, "--outtype", "f16"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"convert_hf_to_gguf.py failed on {model.name}:\n{done.stderr[-3000:]}"


def quantize(source: Path, out: Path, kind: str) -> None:
    """llama.cpp's own quantizer, as `llama-quantize source out kind` runs it."""
    import llama_cpp as package

    params = package.llama_model_quantize_default_params()
    params.ftype = getattr(package, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.nthread = THREADS
    assert package.llama_model_quantize(str(source).encode(), str(out).encode(), params) == 0, (source, kind)


def zoo_gguf(name: str, kind: str) -> Path:
    """The family `name`'s GGUF in quantization `kind` (one of QUANTS), made once a machine."""
    folder = zoo_folder()
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True)  # (another worker may make it first)
        prune_stale(folder)
    out = folder / f"{name}-{kind}.gguf"
    if out.exists():
        return out
    with FileLock(folder / f"{name}.lock"):
        f16 = folder / f"{name}-F16.gguf"
        if not f16.exists():
            with FileLock(folder / "sources.lock"):
                sources = llama_cpp_sources(folder)
            model = folder / f"{name}-hf"
            model.mkdir(exist_ok=True)
            save_model(name, FAMILIES[name], model)
            convert(sources, model, folder / f"{name}-F16.part", FAMILIES[name].pre)
            (folder / f"{name}-F16.part").rename(f16)
            shutil.rmtree(model)  # (its weights in float32: the F16 GGUF is what the tests read)
        if not out.exists():
            quantize(f16, folder / f"{name}-{kind}.part", kind)
            (folder / f"{name}-{kind}.part").rename(out)
    return out
