"""The decode step compiled (`--compile`): one token through `torch.compile` over a static KV cache.

On a GPU a plain step is mostly the host's time: hundreds of kernel launches from Python, for a
135M model and an 8B one alike. Compiled (torch.compile, mode "reduce-overhead", as transformers'
own `get_compiled_call` does) over a cache whose tensors never move, the step is captured once as
CUDA graphs and replayed with one launch; on a CPU the same call runs inductor's code (no graphs).

The journey's cache stays the runner's (see cache.full_cache), which everything else reads and crops:
after a compiled step each of its layers holds views of the first positions of the static buffers, so
nothing is copied while steps follow one another. Anything else that grows the cache (a prefill, a
pass with hooks in force) copies them into buffers of the layer's own, and the next compiled step
first copies those into the static buffers.
The step's query states come out of the graph beside the logits, in one tensor, for the attention
view to keep. It runs no hooks, so the runner uses it only for a step that needs none (see
ModelRunner.forward).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as hooks
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, StaticLayer

from tokenviz.backends.transformers import attention
from tokenviz.backends.transformers.cache import GrowingLayer, full_cache, with_cache
from tokenviz.backends.transformers.device_map import input_device
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.quiet import one_line, quiet
from tokenviz.contract.errors import ModelLoadError, TokenvizError
from tokenviz.contract.snapshot import CANCELS
from tokenviz.contract.text import shortened
from tokenviz.system.interruptible import Interrupted, interruptible

MODE = "reduce-overhead"  # torch.compile's mode: CUDA graphs on a GPU (compiled with fullgraph: one graph, or an error)
# The static buffers' room: the least power-of-two multiple of ROOM that holds the journey, doubled when
# it is outgrown. Each step attends over the whole room (masked), so the room follows the journey.
ROOM = 256
WARM_UP_STEPS = 3  # CUDA graph trees run a new graph eagerly once, record it the next time, replay after that
# torch.compile's entries for one function (its default is 8): every model compiled in a process takes
# one of CompiledStep._pass's, so a test run, or a session that compiles model after model, needs more.
RECOMPILE_LIMIT = 64
COMPILE_CANCELLED = "eager: the compile was cancelled (Escape)"
REASON_CHARS = 160  # of torch.compile's reason for a failure, in the one line that says it (its messages run to pages)


class RoomLayer(StaticLayer):
    """A static buffer whose room is read from its tensors' length, which is marked dynamic when they
    are made: one compile serves every room. (StaticLayer gives the mask its `max_cache_len`, an int
    torch.compile would specialise on and compile again for at every new room.)"""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return _tensors(self)[0].shape[-2], 0


def room_for(length: int, least: int = ROOM) -> int:
    """The room of buffers that hold `length` positions and the next one."""
    room = least
    while room < length + 1:
        room *= 2
    return room


class CompiledStep:
    """One model's compiled decode step and the static buffers it writes. Runners that share the
    model share it: the buffers hold one cache's positions at a time (see `_own`)."""

    def __init__(self, model: PreTrainedModel, least: int = ROOM):
        self.model = model
        self.call: Callable[..., tuple[torch.Tensor, torch.Tensor]] = torch.compile(
            self._pass, mode=MODE, fullgraph=True
        )
        self._keyword = next(iter(with_cache(model, None)))  # the cache's argument name, found before tracing
        self.query_shapes: list[tuple[int, int]] = []  # each layer's (heads, head size): see warm_up
        self.least = least
        self.failed: str | None = None  # why a step failed: the steps run eager from then on
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._modules = tuple(model.modules())  # asked for hooks before every step: see `hooked`
        self.static: Cache | None = None  # the model's cache argument: `buffers`, one a layer
        self.buffers: list[StaticLayer] = []
        self._owner: weakref.ref[Any] | None = None  # the DynamicCache whose layers are views of the buffers
        self._counted = -1  # the position every static layer's counter holds (-1: not known)

    @property
    def capacity(self) -> int:
        return self.buffers[0].max_cache_len if self.buffers else 0

    def serves(self, cache: Any) -> bool:
        """Whether `cache` is one this step can follow: a filled cache of one row whose layers keep
        every position (see full_cache), and no step of this model has failed."""
        layers = getattr(cache, "layers", None) or []
        return (
            not self.failed
            and bool(layers)
            and all(isinstance(layer, GrowingLayer) and layer.is_initialized for layer in layers)
            and all(layer.keys.shape[0] == 1 for layer in layers)
        )

    def hooked(self) -> bool:
        """Whether any hook would run in a forward pass of the model (a compiled graph runs none)."""
        if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
            return True
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)

    def _pass(self, ids: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, torch.Tensor]:
        """What is compiled: one forward pass of one token; its next-token logits and every layer's
        query states, flat, in layer order."""
        out = self.model(input_ids=ids, **{self._keyword: cache}, use_cache=True, logits_to_keep=1)
        queries = [q.reshape(-1) for q in attention.compiled_queries]
        attention.compiled_queries.clear()  # left empty, so no call adds to it
        return out.logits[0, -1], torch.cat(queries) if queries else out.logits.new_empty(0)

    @torch.inference_mode()
    def step(self, cache: Any, ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Feed one token (`ids`, (1, 1) on the model's device) after what `cache` holds; its layers
        grow by that position. The next-token logits (vocab,) come back, and each layer's query states
        (heads, 1, head size) where they are the attention view's, tensors of their own."""
        length = cache.get_seq_length()
        static = self._own(cache, length)
        if ids.device.type == "cuda":
            graph_trees_in_this_thread()
        torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs may be overwritten now
        try:
            logits, flat = self.call(ids, static)
        except Exception as exc:  # (a recompile torch.compile refuses, the device's memory): not again
            self.failed = shortened(one_line(exc), REASON_CHARS)
            raise TokenvizError(f"the compiled step failed ({self.failed}): the steps run eager from now on") from None
        logits, flat = logits.clone(), flat.clone()  # the graph's output buffers are the next replay's
        self._counted = length + 1
        self._show(cache, length + 1)
        return logits, self._queries(flat)

    def _queries(self, flat: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each layer's query states, views of one flat tensor (none where their count is not the layers')."""
        if flat.numel() != sum(heads * size for heads, size in self.query_shapes):
            return {}
        out, at = {}, 0
        for layer, (heads, size) in enumerate(self.query_shapes):
            out[layer] = flat[at : at + heads * size].view(heads, 1, size)
            at += heads * size
        return out

    def _own(self, cache: Any, length: int) -> Cache:
        """The static buffers, holding `cache`'s `length` positions and counting from there."""
        if self.static is None or length + 1 > self.capacity:
            self._made(cache, room_for(length, self.least))
        owner = self._owner() if self._owner is not None else None
        if owner is not cache:
            if owner is not None:
                self._detach(owner)
            self._owner = weakref.ref(cache)
        for held, buffer in zip(cache.layers, self.buffers):
            (keys, values), (room_keys, room_values) = _tensors(held), _tensors(buffer)
            if keys.data_ptr() != room_keys.data_ptr() or keys.shape[-2] != length:  # grown by a pass of another kind
                room_keys[:, :, :length].copy_(keys)
                room_values[:, :, :length].copy_(values)
        if self._counted != length:
            for buffer in self.buffers:
                buffer.cumulative_length.fill_(length)
            self._counted = length
        assert self.static is not None
        return self.static

    def _made(self, cache: Any, room: int) -> None:
        """New buffers of `room` positions. Nothing writes the old ones again: a cache still viewing
        them keeps them, and its positions are copied in when it steps."""
        self.buffers = [RoomLayer(max_cache_len=room) for _ in cache.layers]
        for held, buffer in zip(cache.layers, self.buffers):
            buffer.lazy_initialization(*_tensors(held))
            for tensor in _tensors(buffer):
                torch._dynamo.mark_dynamic(tensor, 2)
        self.static = Cache(layers=list(self.buffers))
        self._owner, self._counted = None, -1

    def _show(self, cache: Any, length: int) -> None:
        """Make `cache`'s layers the first `length` positions of the buffers (views: nothing is copied)."""
        for held, buffer in zip(cache.layers, self.buffers):
            keys, values = _tensors(buffer)
            held.take(keys[:, :, :length], values[:, :, :length])

    def _detach(self, cache: Any) -> None:
        """Give a cache that leaves the buffers tensors of its own (another cache is about to write them)."""
        for held, buffer in zip(cache.layers, self.buffers):
            keys, values = _tensors(held)
            if keys.data_ptr() == _tensors(buffer)[0].data_ptr():
                held.take(keys.clone(), values.clone())

    def warm_up(self, device: torch.device) -> None:
        """Compile the step now, on a throwaway cache, so a journey's steps take what steps take. The
        room is a dynamic size in the one graph (see RoomLayer): a journey that outgrows its buffers
        compiles nothing more (on a GPU, it records graphs for the new room)."""
        cache = full_cache()
        with torch.inference_mode():  # as a runner's steps are: ids made outside it would be compiled for again
            ids = torch.zeros((1, 1), dtype=torch.long, device=device)
            with attention.capturing() as capture:  # each layer's query shape, as the attention view keeps them
                self.model(input_ids=ids, **with_cache(self.model, cache), use_cache=True)
            if sorted(capture.queries) == list(range(len(capture.queries))):
                self.query_shapes = [(q.shape[0], q.shape[-1]) for _, q in sorted(capture.queries.items())]
            self._made(cache, self.least)
            for _ in range(WARM_UP_STEPS):
                self.step(cache, ids)
        self.static, self.buffers, self._owner = None, [], None  # a journey's buffers are made for it


def graph_trees_in_this_thread() -> None:
    """Give this thread CUDA graph trees' state if it has none. Torch keeps that state per thread
    but, before 2.12 or so, set it up only in the thread that imported the module (and autograd's): a
    step that must record a new room's graphs in another thread (the app's engine thread, after a
    warm-up elsewhere) failed there on an assertion. Newer torch sets it up itself, the same way."""
    from torch._inductor import cudagraph_trees as trees

    if not hasattr(trees.local, "tree_manager_containers") and not torch._C._is_key_in_tls("tree_manager_containers"):
        trees.local.tree_manager_containers = {}
        trees.local.tree_manager_locks = collections.defaultdict(threading.Lock)
        torch._C._stash_obj_in_tls("tree_manager_containers", trees.local.tree_manager_containers)
        torch._C._stash_obj_in_tls("tree_manager_locks", trees.local.tree_manager_locks)


def _tensors(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's keys and values (a GrowingLayer that CompiledStep.serves, or a static buffer)."""
    return layer.keys, layer.values


def compiled(loaded: LoadedModel, progress: Callable[[str, float | None], None], least: int = ROOM) -> LoadedModel:
    """`loaded` with its decode step compiled and its graphs recorded, before any journey: once per
    start (seconds on a CPU for a small model, about a minute on a GPU for a large one). Its static
    buffers hold `least` positions at first."""
    if not getattr(loaded.model, "_can_compile_fullgraph", False):  # transformers' own word: GPT-Neo, MPT
        name = type(loaded.model).__name__
        raise ModelLoadError(
            f"--compile: transformers does not compile {name}'s step with a static cache: run without it"
        )
    device = input_device(loaded.model)
    progress(f"compiling the decode step on {device}, once per start (cancelled, the steps run eager) {CANCELS}", None)
    step = CompiledStep(loaded.model, least)
    try:
        with quiet(), interruptible():  # quiet: the compiler's warnings would land on the terminal the app draws
            step.warm_up(device)
    except Interrupted:  # (Escape: see tokenviz.system.interruptible) the model as it loaded, its steps eager
        attention.compiled_queries.clear()
        torch.compiler.reset()  # what the compile had made so far
        progress(COMPILE_CANCELLED, None)
        return dataclasses.replace(loaded, info=dataclasses.replace(loaded.info, compiled=COMPILE_CANCELLED))
    except Exception as exc:  # torch.compile's own failures: a model it cannot trace, no C++ compiler
        reason = step.failed or shortened(one_line(exc), REASON_CHARS)  # a step's own failure is said once
        raise ModelLoadError(
            f"--compile: torch.compile cannot compile this model's step ({reason}): run without it"
        ) from None
    how = "CUDA graphs" if device.type == "cuda" else "inductor's code, no graphs off a GPU"
    rooms = ", ".join(f"{least * 2**k:,}" for k in range(3))
    note = f"the decode step, compiled ({how}), over a static cache of {rooms} … positions, as the journey needs"
    return dataclasses.replace(loaded, compiled=step, info=dataclasses.replace(loaded.info, compiled=note))
