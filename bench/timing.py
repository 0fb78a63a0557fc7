"""Timing: each measure in a thread of its own, the device waited for, rounds paired."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def in_thread(run: Callable[[], T]) -> T:
    """`run()` in a thread of its own, joined: every measure, and generate() beside autoplay, so the
    main thread never runs the model, as in the app, where the engine thread alone does. GNU OpenMP
    (torch's CPU threads) keeps a team of threads for each thread that has run a parallel region, and
    its workers wait for the next region spinning only while there are no more of them than cores;
    past that they sleep, and each region wakes them (sdpa over one token: 0.074 ms in a thread made
    after the main thread had run it, 0.013 ms before, on this 2-core machine). A thread's team goes
    with it, so measures run one after another in threads of their own each see one team."""
    out: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:  # (raised again in the caller's thread)
            failed.append(exc)

    thread = threading.Thread(target=target, name="bench")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds_of(step: Callable[[], object], device: torch.device) -> float:
    """One call of `step`, the device's queued work included."""
    sync(device)
    started = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - started


def paired_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median over rounds of each round's a / b: a round's two measures are taken seconds apart,
    and this 2-core machine's pace drifts more than that between rounds (medians of all of a's and
    all of b's moved a ratio by 0.05-0.2 between identical runs)."""
    return statistics.median(a / b for a, b in pairs)


def p95(times: list[float]) -> float:
    """The 95th percentile of `times` (the slowest one in twenty): a step that copies the whole cache
    shows here, where a median hides it."""
    return statistics.quantiles(times, n=20, method="inclusive")[-1]
