"""The benchmark: what watching costs over running the model bare, as ratios measured side by side
in one process on the same model, device and dtype.

    python -m bench [--device auto|cpu|cuda] [--dtype ...] [--shape 8B|135M] [--only M,M] [--quick] [--out DIR]

Prints a table and writes bench/results/<device>[-<shape>]-<date>.json. `--shape 8B` measures a
Llama-3-8B-shaped model with random weights made on the device (bench/shaped.py) instead of the
bundled one: the engine's step, prefill, autoplay and device memory. `--shape 135M` is the bundled
model's shape with random weights, for a machine the bundled model's file does not reach. `--gguf 1B`
(or a GGUF file) runs the llama.cpp measures on a larger model than the bundled one (bench/shaped_gguf.py).

This module runs the measures and writes their file; each lives with its kind: bench.engine (the
step, prefill, autoplay, memory), bench.app (frames, keys, the start), bench.processes (whole
processes), bench.served (--endpoint), bench.llamacpp (--backend llama.cpp, where llama-cpp-python is
installed), against the bare runs of bench.anchors, timed by
bench.timing, judged by bench.budgets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

from bench.app import app_autoplay, cold_start, frame, key_frame, snapshot_growth, terminal_guard, ui_growth
from bench.budgets import verdicts
from bench.engine import (
    attention_view,
    autoplay,
    autoplay_sampled,
    beams,
    compiled_autoplay,
    device_peak,
    grammar_step,
    growth,
    intervention_step,
    lens_step,
    memory,
    sae_step,
    step_overhead,
)
from bench.llamacpp import gguf_described, gpu_layers_refused, llamacpp_measures
from bench.processes import conversion, offload, peak_memory, refusal, trace_long
from bench.served import served, served_lens
from bench.shaped import SHAPES, measured_models
from bench.shaped_gguf import GGUF_SHAPES
from bench.timing import in_thread
from tokenviz.backends.transformers.gguf_cache import gguf_cache_dir
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text
from tokenviz.files.record_json import as_json
from tokenviz.system.paths import bundled_gguf


def arguments(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line, its GGUF and GPU layers checked (a mistake: one line, exit 2)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="a model of Llama 3 8B's shape, or the bundled model's (135M), with random weights made on the device",
    )
    parser.add_argument("--only", default="", help="the measures to run, by name, comma-separated (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, not for the record)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--endpoint",
        help="an OpenAI-compatible server for the served measure (trace --endpoint); "
        "python -m tokenviz.cli.start_vllm starts one on the bundled model",
    )
    parser.add_argument("--api-key-env", help="with --endpoint: the environment variable holding its API key")
    parser.add_argument(
        "--insecure-http", action="store_true", help="with --endpoint: send the key over plain http to another host"
    )
    parser.add_argument(
        "--gguf",
        help="the GGUF of the llama.cpp measures: a file, or a shape made from the bundled model's vocabulary "
        f"with random weights ({', '.join(GGUF_SHAPES)}: bench/shaped_gguf.py); the bundled one by default",
    )
    parser.add_argument(
        "--gpu-layers",
        type=int,
        default=0,
        help="the layers of the llama.cpp measures' GGUF offloaded to the GPU, on both sides (tokenviz's "
        "--gpu-layers, llama-cpp-python's n_gpu_layers); llama-cpp-python must be built for the GPU",
    )
    args = parser.parse_args(argv)
    if args.gguf and args.gguf not in GGUF_SHAPES and not Path(args.gguf).is_file():
        parser.error(f"--gguf {args.gguf}: neither a file nor a shape ({', '.join(GGUF_SHAPES)})")
    if why := gpu_layers_refused(args.gpu_layers):
        parser.error(f"--gpu-layers {args.gpu_layers:,}: {why}")
    return parser, args


def main(argv: list[str] | None = None) -> int:
    parser, args = arguments(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    torch.manual_seed(0)
    loaded, bare = measured_models(args.device, args.dtype, args.shape)
    device = next(loaded.model.parameters()).device
    steps = 8 if args.quick else 32
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        },
        # (with --gguf the measures run on that GGUF: the file describes it, not the transformers model)
        "model": gguf_described(args.gguf, args.gpu_layers) if args.gguf or args.gpu_layers else as_json(loaded.info),
    }
    console.print(f"[bold]tokenviz bench[/] on {loaded.info.name}, {device}, {loaded.info.dtype}")
    measures = [
        ("autoplay", lambda: autoplay(loaded, bare, device, 32 if args.quick else 128)),
        ("autoplay_sampled", lambda: autoplay_sampled(loaded, bare, device, 32 if args.quick else 128)),
        ("step_overhead", lambda: step_overhead(loaded, bare, device, steps)),
        (
            "growth",
            lambda: growth(loaded, bare, device, lengths=(32, 2048) if args.shape == "8B" else (32, 512, 2048, 4096)),
        ),
        ("attention_view", lambda: attention_view(loaded)),
        ("device_peak", lambda: device_peak(loaded)),
        ("peak_memory", peak_memory),
        ("frame", lambda: frame(loaded)),
        ("ui_growth", lambda: ui_growth(loaded, long=1000 if args.quick else 6000)),
        ("snapshot_growth", lambda: snapshot_growth(loaded, long=1000 if args.quick else 6000)),
        ("app_autoplay", lambda: app_autoplay(loaded, context=500 if args.quick else 2000)),
        ("cold_start", cold_start),
        ("terminal_guard", terminal_guard),
        ("conversion", conversion),
        ("memory", lambda: memory(loaded, 100 if args.quick else 1000)),
        ("beams", lambda: beams(loaded, long=500 if args.quick else 2000)),
        ("key_frame", lambda: key_frame(loaded)),
        ("offload", lambda: offload(device=device.type)),
        ("refusal", refusal),
        ("grammar_step", lambda: grammar_step(loaded, steps)),
        ("intervention_step", lambda: intervention_step(loaded, steps)),
        ("sae_step", lambda: sae_step(loaded, device, steps)),
        ("lens_step", lambda: lens_step(loaded, device, steps, lengths=(0, 500) if args.quick else (0, 2000))),
        ("trace_long", lambda: trace_long(loaded, n=1000 if args.quick else 4200)),
        ("compiled_autoplay", lambda: compiled_autoplay(loaded, bare, device, 32 if args.quick else 128, steps)),
    ]
    if args.endpoint:  # (the server's model is what it serves: the bundled one, for figures beside these)
        from tokenviz.backends.shared.endpoint import ApiKey

        key = ApiKey(env=args.api_key_env)
        measures.append(("served", lambda: served(args.endpoint, key, args.insecure_http, 8 if args.quick else 32)))
        files = str(gguf_cache_dir(bundled_gguf()))  # (the server's model: the bundled one's directory)
        measures.append(
            ("served_lens", lambda: served_lens(args.endpoint, key, files, args.insecure_http, 8 if args.quick else 16))
        )
    measures += llamacpp_measures(
        loaded if args.shape is None else None, steps, 32 if args.quick else 128, args.gguf, args.gpu_layers
    )
    chosen = set(filter(None, args.only.split(",")))
    if args.shape == "8B":  # what a model of that size adds to the bundled model's figures: the engine's cost
        chosen = chosen or {"autoplay", "step_overhead", "growth", "attention_view", "device_peak", "compiled_autoplay"}
    if device.type != "cuda" or args.shape != "8B":  # (a 135M model's prefill logits outweigh its weights)
        measures = [m for m in measures if m[0] != "device_peak"]
    unknown = chosen - {name for name, _ in measures}
    if unknown:
        parser.error(f"no such measure: {', '.join(sorted(unknown))}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        device.type,
        args.shape,
        args.gguf and f"gguf-{Path(args.gguf).stem}",
        args.gpu_layers and f"gpu-layers-{args.gpu_layers}",
        results["date"],
        "quick" if args.quick else None,
        "only" if chosen and args.shape != "8B" else None,
    ]
    path = out / f"{'-'.join(p for p in parts if p)}.json"
    for name, run in measures:
        if chosen and name not in chosen:
            continue
        console.print(f"  measuring {name}…")
        try:
            results[name] = in_thread(run)
        except TokenvizError as exc:  # (a server that lies or stops, a model that cannot load: one line)
            console.print(f"error: {name}: {safe_text(str(exc))}", markup=False, highlight=False, soft_wrap=True)
            return 2
        path.write_text(json.dumps(results, indent=2))  # (so far: a run stopped part way keeps what it measured)
    results["budgets"] = verdicts(results)

    table = Table(title="tokenviz bench", header_style="bold")
    for col in ("measure", "value", "budget", "met"):
        table.add_column(col)
    for v in results["budgets"].values():
        if v["value"] is None:
            continue
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "—"}[v["met"]]
        table.add_row(v["label"], f"{v['value']:.3f}", v["budget"], met)
    Console().print(table)
    Console().print_json(json.dumps({k: v for k, v in results.items() if k not in ("budgets", "machine", "model")}))
    path.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
