"""The table of docs/big-models.md's "What a quantization changes": the bundled model's GGUF (Q4_1 as
shipped) and the same weights quantized by llama.cpp's own quantizer to Q8_0 and Q4_K_M, each scored
against an F16 GGUF of them with `tokenviz score --against-model`, in llama-perplexity's terms.

The F16 base is the shipped Q4_1 dequantized by transformers and converted by llama.cpp's own
convert_hf_to_gguf.py (the vendored one of the pinned llama-cpp-python, as the tests' GGUF zoo does): the
original weights are not shipped, so Q4_1 against it measures what llama.cpp's Q4_1 kernels change beyond
the weights (the activations quantized for the matmuls), and Q8_0 and Q4_K_M what requantizing adds.

    .venv/bin/python docs/make_quantization_table.py [FOLDER]   (FOLDER: where the GGUFs are made)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path[:0] = [str(ROOT / "tests" / "llamacpp"), str(ROOT / "tests")]

from gguf_zoo import convert, llama_cpp_sources, quantize  # noqa: E402

from tokenviz.contract.results import lens_row_label  # noqa: E402
from tokenviz.system.paths import bundled_gguf  # noqa: E402

TEXT = ROOT / "README.md"
WINDOW = 512
KINDS = ("Q8_0", "Q4_K_M")


def f16_of_the_bundled(folder: Path) -> Path:
    """The shipped Q4_1's weights dequantized and converted to F16 by llama.cpp's own converter."""
    out = folder / "smollm2-F16.gguf"
    if out.exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    hf = folder / "smollm2-hf"
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(hf)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    config = loaded.config  # (transformers saves no model it read from a GGUF: a plain one, its weights)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(hf)
    convert(llama_cpp_sources(folder), hf, out, None)
    return out


def scored(model: Path, base: Path) -> dict:
    command = [sys.executable, "-m", "tokenviz", "score", str(TEXT), "--backend", "llama.cpp", "--model", str(model)]
    command += ["--against-model", str(base), "--window", str(WINDOW), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="quantization-"))
    folder.mkdir(parents=True, exist_ok=True)
    base = f16_of_the_bundled(folder)
    files = {"Q4_1 (as shipped)": bundled_gguf()}
    for kind in KINDS:
        files[kind] = folder / f"smollm2-{kind}.gguf"
        if not files[kind].exists():
            quantize(base, files[kind], kind)
    print("| against F16 | PPL(Q)/PPL(base) | mean KLD | 99% KLD | max KLD | RMS Δp | same top p |")
    print("|---|---|---|---|---|---|---|")
    docs = {name: scored(path, base) for name, path in files.items()}
    for name, doc in docs.items():
        s = doc["statistics"]
        print(
            f"| {name} | {s['ppl_ratio']:.4f} ± {s['ppl_ratio_unc']:.4f} | {s['mean_kld']:.5f} | "
            f"{s['kld_p99']:.4f} | {s['max_kld']:.4f} | {100 * s['rms_dp']:.2f}% | {100 * s['same_top_p']:.2f}% |"
        )
    last = docs[KINDS[-1]]
    print(
        f"\n{last['statistics']['count']} tokens scored in {last['windows']} windows of {WINDOW}; {KINDS[-1]}'s tails:"
    )
    for t in last["tails"]["by_kld"][:5]:
        lens = t["lens"] or {}
        parted = lens.get("parted_from")
        q, b = t["top"][0], t["base_top"][0]
        print(
            f"- {t['before'][-30:]!r} → {t['text']!r}: KLD {t['kld']:.3f}, Q4_K_M's top {q['text']!r} {q['prob']:.3f}, "
            f"F16's {b['text']!r} {b['prob']:.3f}, parted from {lens_row_label(parted) if parted is not None else '—'}"
        )


if __name__ == "__main__":
    main()
