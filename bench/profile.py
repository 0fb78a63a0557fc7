"""Where the engine's time goes beside the bare model's: torch's profiler over a prefill and a decode
step of each, the kernels by device time and the operators by host time, side by side.

    python -m bench.profile [--device auto|cpu|cuda] [--shape 135M|8B] [--lengths 2048,4096] [--rows 12]

With `--shape`, a model of that shape with random weights made on the device (bench/shaped.py);
without, the bundled model. Prints, for each length, each side's wall time, its kernels' time and
count (a GPU's launches), and the top kernels and host operators; then the same for one decode step.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from bench.anchors import bare_decoder
from bench.engine import random_ids, started_session
from bench.shaped import SHAPES, measured_models
from bench.timing import in_thread, sync


def profiled(run: Callable[[], object], device: torch.device, rounds: int = 3) -> tuple[float, object]:
    """(the fastest of `rounds` wall times of `run()` in ms, the profile of one more run)."""
    times = []
    for _ in range(rounds):
        sync(device)
        started = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - started)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        sync(device)
    return min(times) * 1000, prof


def report(name: str, wall_ms: float, prof, device: torch.device, rows: int) -> None:
    events = prof.key_averages()
    on_device = device.type == "cuda"
    kernels = [e for e in events if on_device and str(e.device_type).endswith("CUDA")]
    kernel_ms = sum(e.device_time_total for e in kernels) / 1000
    launches = sum(e.count for e in kernels)
    ops = [e for e in events if e.key.startswith("aten::")]
    print(
        f"\n== {name}: wall {wall_ms:.2f} ms · kernels {kernel_ms:.2f} ms in {launches} launches · "
        f"{sum(e.count for e in ops)} aten calls"
    )
    if on_device:
        print("   top kernels by device time:")
        for e in sorted(kernels, key=lambda e: -e.device_time_total)[:rows]:
            print(f"   {e.device_time_total / 1000:9.3f} ms {e.count:6d}×  {e.key[:90]}")
    print("   top operators by host time (self):")
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:rows]:
        print(f"   {e.self_cpu_time_total / 1000:9.3f} ms {e.count:6d}×  {e.key[:90]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--lengths", default="2048,4096")
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    loaded, bare = measured_models(args.device, args.dtype, args.shape)
    device = next(loaded.model.parameters()).device
    print(f"{loaded.info.name} on {device}, {loaded.info.dtype}")

    def prefills(n: int) -> None:
        ids = random_ids(loaded, n)
        with torch.inference_mode():
            bare_ms, bare_prof = profiled(lambda: bare(torch.tensor([ids], device=device)), device)
        session, _ = started_session(loaded, ids)  # (its runner made, and its first prefill, outside)
        engine_ms, engine_prof = profiled(lambda: session.start(ids, defer_predictions=True), device)
        report(f"bare forward, {n} tokens", bare_ms, bare_prof, device, args.rows)
        report(f"engine prefill, {n} tokens ({engine_ms / bare_ms:.2f}×)", engine_ms, engine_prof, device, args.rows)

    def steps(n: int = 8) -> None:
        ids = random_ids(loaded, n)
        session, _ = started_session(loaded, ids)
        bare_step = bare_decoder(bare, ids, device)
        bare_ms, bare_prof = profiled(bare_step, device, rounds=10)
        engine_ms, engine_prof = profiled(session.step, device, rounds=10)
        report("bare decode step", bare_ms, bare_prof, device, args.rows)
        report(f"engine decode step ({engine_ms / bare_ms:.2f}×)", engine_ms, engine_prof, device, args.rows)

    for n in (int(x) for x in args.lengths.split(",") if x):
        in_thread(functools.partial(prefills, n))
    in_thread(steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
