"""llama.cpp in this process, through llama-cpp-python's bindings of its C API: a model, one context with
its KV cache, and what the engine asks of them (decode a batch and read its logits, cut the cache, the
vocabulary). Nothing here knows about journeys; tokenviz.backends.llamacpp.engine is the engine.

The C API is used directly (llama_cpp.llama_cpp), not llama-cpp-python's `Llama` class: the engine needs
the logits of chosen positions, the cache cut at any position and the evaluation callback, which `Llama`
keeps to itself.
"""

from __future__ import annotations

import collections
import ctypes
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenviz.backends.llamacpp import pinned
from tokenviz.backends.llamacpp.refusals import NO_GPU_BUILD
from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.cpu_threads import cores, told_threads

if TYPE_CHECKING:
    from tokenviz.backends.llamacpp.capture import Capture, Writes

ABORTED = 2  # what llama_decode returns once its abort callback said stop
BATCH = 512  # tokens decoded in one llama_decode (a longer prompt is fed in batches)
FLASH_ATTENTION = ("auto", "on", "off")  # --flash-attention: llama.cpp's own choice (its default), or told
KV_VALUE_BYTES = 2  # llama.cpp's cache keeps keys and values as float16 unless told otherwise
PIECE_BYTES = 256  # a token's text, as bytes, at most (a longer one is read again at its length)


def default_threads() -> int:
    """The CPU threads llama.cpp computes with unless told: OMP_NUM_THREADS where it is set (as torch's
    threads follow it), else every core this process may run on. ggml's threads wait for one another by
    spinning, so more threads than the cores left to the process cost a step several times its time on a
    machine shared with other work: OMP_NUM_THREADS is how such a machine says so."""
    return told_threads() or cores()


def kv_bytes_a_position(layers: int, kv_heads: int, key_dim: int, value_dim: int) -> int:
    """What llama.cpp's cache keeps for one position: every layer's keys and values (float16)."""
    return layers * kv_heads * (key_dim + value_dim) * KV_VALUE_BYTES


def amx_present() -> bool:
    """Whether this CPU has Intel AMX, whose llama.cpp matrix kernel (an "extra buffer type") crashes
    llama-cpp-python 0.3.36 on a Q4_1 model (a segmentation fault in ggml_backend_amx_mul_mat, measured
    here): such a machine runs without the extra buffer types (the plain CPU kernels, the same numbers
    as every other CPU's)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return "amx_int8" in flags or "amx_tile" in flags


_QUIET: list[Any] = []  # the log callback in force (kept alive while llama.cpp holds it)
LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_errors: collections.deque[str] = collections.deque(maxlen=4)  # llama.cpp's last error lines, said on a failure


def _kept(level: int, text: bytes | None, data: object) -> None:
    """llama.cpp's log, kept off the terminal: its error lines are kept to say why a load failed."""
    if level == LOG_ERROR and text:
        _errors.append(safe_text(shortened(text.decode("utf-8", "replace").strip(), 200)))


def why_not_loaded() -> str:
    """What llama.cpp said first of an error since the load began (its own words: "error loading model
    hyperparameters: invalid n_rot: 63, expected 64"), or how to see its whole log."""
    said = next(iter(_errors), None)
    if said is None:
        return "its log says why: run with TOKENVIZ_DEBUG=1"
    return "it says: " + " ".join(said.rsplit("error loading model: ", 1)[-1].split())


def library() -> Any:
    """llama-cpp-python's C bindings, llama.cpp's log kept off the terminal the app draws on (its error
    lines kept to say why a load failed; TOKENVIZ_DEBUG=1 prints it all), or one line saying how to
    install them."""
    try:
        bindings = pinned.bindings()
    except ImportError as exc:
        raise TokenvizError(
            f"the llama.cpp backend needs llama-cpp-python ({exc}): pip install 'tokenviz[llamacpp]' (it is built "
            "from source with the machine's compiler and CMake: about 12 minutes on 2 cores, once)"
        ) from None
    if not os.environ.get("TOKENVIZ_DEBUG"):  # ggml's abort runs a debugger for a backtrace unless told not to
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    if not _QUIET and not os.environ.get("TOKENVIZ_DEBUG"):
        callback_type = bindings.llama_log_set.argtypes[0]
        _QUIET.append(callback_type(_kept))
        bindings.llama_log_set(_QUIET[0], None)
    return bindings


version = pinned.version


@dataclass(frozen=True)
class Edits:
    """What a context changes in the model as it runs: a control vector (llama.cpp adds `control[L - 1]`
    to the residual after layer L, for L from 1: it keeps none for layer 0) and rows written into tensors
    as they are computed (capture.Writes: a patch)."""

    control: np.ndarray | None = None  # (layers - 1, hidden) float32
    writes: Writes | None = None


NO_EDITS = Edits()


@dataclass(frozen=True)
class Fed:
    """One decode as it was asked: llama.cpp's sums depend on a pass's shape (how many tokens, from where,
    which give logits: its kernels and flash attention split the work by it), so a view gives a step's
    own numbers only by feeding the journey's passes as they were fed (Runtime.shaped)."""

    start: int
    tokens: tuple[int, ...]
    outputs: tuple[int, ...]  # indices into tokens whose logits were asked


def cells_reused(own: Sequence[Fed], held: int, plan: Sequence[Fed], upto: int) -> int:
    """How many of `plan`'s first passes (at most `upto`) a cache fed by `own` (holding `held` tokens)
    holds as the plan would feed them: the same passes, none begun earlier."""
    n = 0
    while n < min(upto, len(own), len(plan)) and (own[n].start, own[n].tokens) == (plan[n].start, plan[n].tokens):
        n += 1
    while n > 0 and (held < plan[n].start or (n < len(own) and own[n].start < plan[n].start)):
        n -= 1
    return n


@dataclass
class Shape:
    """The model's shape as llama.cpp reads it from the GGUF."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    context: int  # trained
    size: int  # bytes of its weights
    parameters: int  # counted, every tensor's elements (llama.cpp's description gives a size class instead)
    description: str  # llama.cpp's: "llama 256M Q4_1" (its size class, for a 135M model)


class LoadedModel:
    """A model llama.cpp loaded, freed (llama_model_free) once nothing holds it: each Runtime on it and
    each of their contexts' finalizers hold it, so the model outlives every context made on it."""

    def __init__(self, lib: Any, pointer: Any):
        self.pointer = pointer
        _freed_when_dropped(self, lib.llama_model_free, pointer)


def _freed_when_dropped(owner: object, free: Any, *args: object) -> weakref.finalize[Any, Any]:
    """`free(*args)` once `owner` is garbage, or when the finalizer is called, whichever is first (once).
    Not at the interpreter's exit: the app's process ends with os._exit, and freeing a context there
    while the engine's thread is inside a pass would crash it."""
    finalizer = weakref.finalize(owner, free, *args)
    finalizer.atexit = False
    return finalizer


def _free_context(lib: Any, ctx: Any, model: LoadedModel, capture: Capture | None) -> None:
    """llama_free; `model` and `capture` (its evaluation callback) are arguments so that they live as
    long as the context."""
    lib.llama_free(ctx)


def offload_refused(gpu_layers: int) -> str | None:
    """Why `gpu_layers` cannot be offloaded here, None where they can (or none are asked): a llama-cpp-python
    built for the CPU alone, where llama.cpp would run every layer on the CPU, unsaid."""
    if not gpu_layers:
        return None
    lib = library()
    return None if lib.llama_supports_gpu_offload() else NO_GPU_BUILD


def placement_said(gpu_layers: int, layers: int) -> str:
    """Where a model of `layers` layers runs with `gpu_layers` offloaded, as the model view says it (llama.cpp
    offloads the last layers first, and past the model's layers its output head too)."""
    if gpu_layers <= 0:
        return "cpu (llama.cpp)"
    if gpu_layers > layers:
        return "gpu (llama.cpp: every layer and the head)"
    return f"gpu and cpu (llama.cpp: the last {gpu_layers:,} of {layers:,} layers on the gpu)"


class Runtime:
    """One model in llama.cpp with one context (sequence 0 is the journey's). Not thread-safe.

    What it holds in llama.cpp is freed when it is dropped (or on close): an engine has no close, and a
    test run, a compare or the app's reloads open many (each context of 4,096 tokens of the bundled model
    is about 150 MB)."""

    def __init__(self, path: Path, context: int, gpu_layers: int = 0, threads: int | None = None, flash: str = "auto"):
        self.lib = lib = library()
        lib.llama_backend_init()
        if why := offload_refused(gpu_layers):
            raise TokenvizError(f"--gpu-layers {gpu_layers:,}: {why}")
        self.gpu_layers = gpu_layers
        params = lib.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        if amx_present():
            params.use_extra_bufts = False
        _errors.clear()
        pointer = lib.llama_model_load_from_file(os.fsencode(path), params)
        if not pointer:
            raise TokenvizError(f"llama.cpp could not load {safe_text(path.name)}: {why_not_loaded()}")
        self.loaded = LoadedModel(lib, pointer)
        self.vocab_ptr = lib.llama_model_get_vocab(self.model)
        self.shape = Shape(
            layers=int(lib.llama_model_n_layer(self.model)),
            hidden=int(lib.llama_model_n_embd(self.model)),
            heads=int(lib.llama_model_n_head(self.model)),
            kv_heads=int(lib.llama_model_n_head_kv(self.model)),
            vocab=int(lib.llama_vocab_n_tokens(self.vocab_ptr)),
            context=int(lib.llama_model_n_ctx_train(self.model)),
            size=int(lib.llama_model_size(self.model)),
            parameters=int(lib.llama_model_n_params(self.model)),
            description=self._description(),
        )
        self.context_size = min(context, self.shape.context) if self.shape.context > 0 else context
        self.threads = threads or default_threads()
        self.flash = flash  # flash attention in the journey's contexts (FLASH_ATTENTION)
        self.ctx: Any = None
        self.capture: Capture | None = None  # the evaluation callback's owner (kept alive while the context uses it)
        self.open_context()
        self._new_batch()

    def sibling(
        self,
        capture: Capture | None = None,
        flash_attention: bool | None = None,
        sequences: int = 1,
        context: int | None = None,
    ) -> Runtime:
        """Another context (a cache of its own) on the same model: a comparison's twin, the model's own
        beside interventions, the context the internal views read (with `capture`, see open_context), or a
        search's (`sequences` in one cache of `context` positions, see open_context)."""
        other = object.__new__(Runtime)
        other.lib, other.loaded, other.vocab_ptr, other.shape = self.lib, self.loaded, self.vocab_ptr, self.shape
        other.gpu_layers = self.gpu_layers
        other.context_size = min(context or self.context_size, self.context_size)
        other.threads, other.flash, other.ctx, other.capture = self.threads, self.flash, None, None
        other.open_context(capture, flash_attention, sequences)
        other._new_batch()
        return other

    @property
    def model(self) -> Any:
        """llama.cpp's model (its pointer)."""
        return self.loaded.pointer

    def _new_batch(self) -> None:
        self.batch = self.lib.llama_batch_init(BATCH, 0, 1)
        self._free_batch = _freed_when_dropped(self, self.lib.llama_batch_free, self.batch)

    def _description(self) -> str:
        text = ctypes.create_string_buffer(256)
        self.lib.llama_model_desc(self.model, text, len(text))
        return text.value.decode("utf-8", "replace")

    def open_context(
        self, capture: Capture | None = None, flash_attention: bool | None = None, sequences: int = 1
    ) -> None:
        """A new context (its cache empty, no edits), with `capture`'s evaluation callback (None: none, and
        no cost), flash attention as `flash_attention` says (None: as the user chose, `flash`) and, where it
        is False, the attention probabilities as a tensor of their own.
        With several `sequences`, they share the cache's cells (a copied sequence costs no copy)."""
        lib = self.lib
        self._drop_context()
        params = lib.llama_context_default_params()
        params.n_ctx = self.context_size
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = sequences
        params.kv_unified = sequences > 1
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        chosen = {"on": True, "off": False}.get(self.flash) if flash_attention is None else flash_attention
        if chosen is not None:  # None: llama.cpp's own choice, auto
            params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if chosen else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if capture is not None:
            params.cb_eval = capture.callback
            params.cb_eval_user_data = None
        self.capture = capture
        self._stop: Callable[[], bool] | None = None  # asked between the graph's nodes (stopping_when)
        self.opened = (flash_attention, sequences)  # as reopen opens it again
        self.held: list[int] = []  # the tokens its cache holds, from position 0
        self.passes: list[Fed] = []  # the decodes that fed them (each cut where the next begins)
        self.edits = NO_EDITS  # the edits in force (edit): a view's context is cut whenever they change
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise TokenvizError(f"llama.cpp could not make a context of {self.context_size:,} tokens")
        self._free_ctx = _freed_when_dropped(self, _free_context, lib, self.ctx, self.loaded, capture)

    @contextmanager
    def stopping_when(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """Inside, a decode on this context stops between two of its graph's nodes once `stop()` is True and
        raises Cancelled (llama.cpp's abort callback, asked at every node: set only here; None: not set)."""
        if stop is None:
            yield
            return
        lib, self._stop = self.lib, stop
        callback = lib.ggml_abort_callback(lambda data: bool(stop()))  # (kept alive while llama.cpp holds it)
        lib.llama_set_abort_callback(self.ctx, callback, None)
        try:
            yield
        finally:
            lib.llama_set_abort_callback(self.ctx, lib.ggml_abort_callback(), None)
            self._stop = None

    def _drop_context(self) -> None:
        if self.ctx is not None:
            self._free_ctx()
            self.ctx = None

    def reopen(self, capture: Capture | None) -> None:
        """Open the context again with `capture` (None: none), its cache kept: sequence 0's cells copied
        into the new one as they are (llama_state_seq_get_data, then set_data: bit for bit, at the speed
        of a copy, where feeding them again would recompute them), the edits in force kept."""
        lib, held, edits, passes = self.lib, list(self.held), self.edits, list(self.passes)
        state, written = self._cells()
        self.open_context(capture, *self.opened)
        self.edit(edits)
        if held and lib.llama_state_seq_set_data(self.ctx, state, written, 0) == 0:
            self.clear()  # llama.cpp could not take its own state back: fed again
            self.replay(passes, len(held))
        self.held, self.passes = held, passes

    def _cells(self) -> tuple[Any, int]:
        """Sequence 0's cells as llama.cpp writes them (llama_state_seq_get_data): (the bytes, their count)."""
        size = self.lib.llama_state_seq_get_size(self.ctx, 0)
        state = (ctypes.c_uint8 * max(size, 1))()
        return state, self.lib.llama_state_seq_get_data(self.ctx, state, size, 0)

    @contextmanager
    def beside(self, edits: Edits, what: str, needed: int, room: int = 0, sequences: int = 1) -> Iterator[Runtime]:
        """A context of its own for a search from the journey (`what`: beam search, speculative decoding) of
        `needed` positions (and `room` more it may use), under the journey's `edits`; freed after. Refused
        in one line where a patch is in force (its rows are written through the journey's capture) or the
        search would pass the context."""
        self.refuse_beside(edits, what, needed)
        other = self.sibling(sequences=sequences, context=needed + room)
        try:
            other.edit(edits)
            yield other
        finally:
            other.close()

    def refuse_beside(self, edits: Edits, what: str, needed: int) -> None:
        """Refuse, in one line, `what` in a context beside the journey's where a patch is in force (its rows
        are written through the journey's capture) or `needed` positions would pass the context."""
        if edits.writes:
            raise TokenvizError(f"{what} with a patch in force is not on llama.cpp: take the patch off (I) first")
        if needed > self.context_size:
            raise TokenvizError(f"{what} would pass llama.cpp's context of {self.context_size:,} tokens")

    def close(self) -> None:
        """Free the context and its batch now (a search's, once it is done), not when the runtime is
        dropped: the model stays while another runtime holds it."""
        self._drop_context()
        self._free_batch()

    def edit(self, edits: Edits) -> None:
        """Run the model with `edits` from the next pass on (NO_EDITS: as it is). Rows written need the
        context's capture (open_context)."""
        shape, lib = self.shape, self.lib
        self.edits = edits
        if edits.control is None:
            code = lib.llama_set_adapter_cvec(self.ctx, None, 0, shape.hidden, 0, 0)
        else:
            control = np.ascontiguousarray(edits.control, dtype=np.float32)
            data = control.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            code = lib.llama_set_adapter_cvec(self.ctx, data, control.size, shape.hidden, 1, shape.layers - 1)
        if code != 0:
            raise TokenvizError(f"llama.cpp could not take the control vector (code {code})")
        if self.capture is not None:
            self.capture.write(edits.writes or {})
        elif edits.writes:
            raise AssertionError("rows are written through a context's capture: open it with one")

    # ---- the cache ----------------------------------------------------------------------------------

    def cut(self, start: int) -> None:
        """Forget positions from `start` on (llama_memory_seq_rm): the cache keeps what was before (from 0:
        cleared)."""
        if start == 0:
            self.clear()
            return
        memory = self.lib.llama_get_memory(self.ctx)
        if not self.lib.llama_memory_seq_rm(memory, 0, start, -1):
            raise TokenvizError(f"llama.cpp could not cut its cache at {start}")
        del self.held[start:]
        self._forget_passes(start)

    def _forget_passes(self, start: int) -> None:
        """The passes begun at `start` or after forgotten (those begun before keep their tokens whole)."""
        while self.passes and self.passes[-1].start >= start:
            self.passes.pop()

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        self.held, self.passes = [], []

    def shaped(self, ids: Sequence[int]) -> list[Fed]:
        """The passes that feed `ids` from position 0 as this context fed them: its own while `ids` agree
        with what it holds (each whole: one it was cut inside is fed whole and cut where the next begins),
        then a token a pass, as steps are fed."""
        agreed = shared_prefix(self.held, ids)
        plan = [fed for fed in self.passes if fed.start < agreed]
        return plan + [Fed(i, (int(ids[i]),), (0,)) for i in range(agreed, len(ids))]

    def replay(self, plan: Sequence[Fed], upto: int) -> None:
        """Feed `plan`'s passes, each cut where the next begins and the last at `upto`."""
        for fed in plan:
            self.cut(fed.start)
            self.decode(fed.tokens, fed.start, outputs=fed.outputs)
        if len(self.held) > upto:
            self.cut(upto)

    def take_cells(self, other: Runtime, upto: int) -> bool:
        """Hold what `other` (a context on the same model) holds of positions before `upto`, as it computed
        them: its cells copied (llama_state_seq_get_data, then set_data: bit for bit, at the speed of a
        copy), its passes with them. False where there was none to take or llama.cpp could not take them
        (the cache is then empty)."""
        state, written = other._cells()
        self.clear()
        if not other.held or self.lib.llama_state_seq_set_data(self.ctx, state, written, 0) == 0:
            return False
        self.held, self.passes = list(other.held), list(other.passes)
        self.cut(upto)
        return True

    # ---- decoding -------------------------------------------------------------------------------------

    def decode(
        self, tokens: Sequence[int], start: int, every_position: bool = False, outputs: Sequence[int] = ()
    ) -> np.ndarray:
        """Feed `tokens` at positions from `start`: the logits after each (every_position), after those
        of `outputs` (indices into `tokens`, ascending) or after the last, (rows, vocab) float32 as
        llama.cpp computed them. (llama.cpp computes the last layer at those positions alone.)"""
        lib, vocab, rows = self.lib, self.shape.vocab, []
        del self.held[start:]
        wanted = set(range(len(tokens))) if every_position else set(outputs) or {len(tokens) - 1}
        self._forget_passes(start)
        self.passes.append(Fed(start, tuple(int(t) for t in tokens), tuple(sorted(wanted))))
        for first in range(0, len(tokens), BATCH):
            part = tokens[first : first + BATCH]
            batch = self.batch
            batch.n_tokens = len(part)
            for i, token in enumerate(part):
                batch.token[i] = token
                batch.pos[i] = start + first + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = first + i in wanted
            if self.capture is not None:
                asked = [start + first + i for i in range(len(part)) if first + i in wanted]
                self.capture.batch(start + first, len(part), asked)
            code = lib.llama_decode(self.ctx, batch)
            if code != 0:
                self.cut(start)
                if code == ABORTED and self._stop is not None:
                    raise Cancelled("the pass was set aside")
                raise TokenvizError(f"llama.cpp could not decode {len(part)} tokens at {start + first} (code {code})")
            self.held.extend(part)
            for i in (i for i in range(len(part)) if first + i in wanted):
                pointer = lib.llama_get_logits_ith(self.ctx, i)
                rows.append(np.ctypeslib.as_array(pointer, shape=(vocab,)).copy())
        return rows[0][np.newaxis] if len(rows) == 1 else np.stack(rows)  # (a step's one row: not copied again)

    # ---- the vocabulary -------------------------------------------------------------------------------
    # Read through llama.cpp's own functions, a buffer grown to fit, not llama-cpp-python's _internals: its
    # token_to_piece keeps 32 bytes padded with NULs (none of a longer piece: 47 of the bundled vocabulary's),
    # its tokenize allocates the training context's length each call, its metadata decodes strictly.

    def tokenize(self, text: str, special: bool, parse_special: bool | None = None) -> list[int]:
        """`text`'s tokens as llama.cpp makes them; `special`: add a BOS where the model wants one and (unless
        `parse_special` says otherwise) read special tokens written in the text (a chat template's)."""
        data = text.encode("utf-8", "surrogatepass")
        parse = special if parse_special is None else parse_special
        room = len(data) + 16
        tokens = (self.lib.llama_token * room)()
        n = self.lib.llama_tokenize(self.vocab_ptr, data, len(data), tokens, room, special, parse)
        if n < 0:
            room = -n
            tokens = (self.lib.llama_token * room)()
            n = self.lib.llama_tokenize(self.vocab_ptr, data, len(data), tokens, room, special, parse)
        return list(tokens[:n])

    def piece_bytes(self, token: int) -> bytes:
        """The bytes `token` adds to a text (a special token's own text too)."""
        text = ctypes.create_string_buffer(PIECE_BYTES)
        n = self.lib.llama_token_to_piece(self.vocab_ptr, token, text, PIECE_BYTES, 0, True)
        if n < 0:
            text = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab_ptr, token, text, -n, 0, True)
        return text.raw[:n]

    def is_end(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab_ptr, token))

    def is_control(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_control(self.vocab_ptr, token))

    def metadata(self, key: str) -> str | None:
        """The GGUF's metadata value under `key` as text (a chat template's may be tens of kilobytes)."""
        text = ctypes.create_string_buffer(4096)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), text, len(text))
        if n >= len(text):  # cut: n is the whole value's length
            text = ctypes.create_string_buffer(n + 1)
            n = self.lib.llama_model_meta_val_str(self.model, key.encode(), text, len(text))
        return None if n < 0 else text.value.decode("utf-8", "replace")
