"""Work on a CPU that takes one thread: torch's threads wait on one another whenever a core is busy
with something else (the app drawing, a server beside it, the machine's other work), so small work on a
vocabulary row or a few of them runs faster on one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """One torch thread inside, where `device` is a CPU. Beside one busy core, the bundled model's sampling
    stages took 14 ms with two threads and 6 ms with one; a served model's lens of 5 rows, beside a vLLM
    server that polls a core for a second after each request, 105 ms and 23 ms. (Process-wide, and cheap
    to set: 0.4 µs.)"""
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    if threads == 1:  # a GPU's, or inside another: a step sets it once for its summary and decision
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
