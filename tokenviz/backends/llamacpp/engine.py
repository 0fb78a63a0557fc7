"""The llama.cpp backend's engine (contract.engine): a GGUF stepped in llama.cpp in this process, in its own
quantization. Each step's logits over the whole vocabulary are llama.cpp's own; tokenviz's sampling stages
and decision run on them as on any model (decoding/). Its KV cache is llama.cpp's: a rewind cuts it
(llama_memory_seq_rm), so a step taken again is computed the same way and gives the same logits, bit for
bit. Tokens and their text are llama.cpp's tokenizer's, as llama.cpp itself runs the model.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenviz.backends.llamacpp.capture import Capture
from tokenviz.backends.llamacpp.internals import LlamaInternals
from tokenviz.backends.llamacpp.interventions import LlamaIntervening, OwnModel
from tokenviz.backends.llamacpp.refusals import LACKS_WHY
from tokenviz.backends.llamacpp.routing import moe_routers
from tokenviz.backends.llamacpp.runtime import (
    FLASH_ATTENTION,
    NO_EDITS,
    Edits,
    Runtime,
    kv_bytes_a_position,
    placement_said,
    version,
)
from tokenviz.backends.shared.chat_marks import template_marks
from tokenviz.backends.shared.chat_template import render_chat_template
from tokenviz.backends.shared.routes import join_routes, read_routing
from tokenviz.contract.engine import (
    WHOLE_VOCABULARY,
    AttentionRows,
    Caching,
    Capability,
    ChatIds,
    DenseInOnePlace,
    Elapsed,
    Engine,
    Forward,
    FullScores,
    Host,
    Intervenable,
    IsCancelled,
    Lens,
    LensOfScores,
    OnProgress,
    OwnGrammarVocabulary,
    Residuals,
    ResidualStream,
    Scores,
    SearchAsk,
    TimesByPlace,
    in_order,
    shared_prefix,
)
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import ModelInfo, Routing
from tokenviz.contract.results import BeamResult, Inspection, LensAsk, Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.decoding.prompt_predictions import predict_positions
from tokenviz.files.gguf_header import GgufHeader
from tokenviz.system.paths import BUNDLED_NAME


@dataclass
class LlamaForward:
    """What one llama_decode gave: the logits after the last token fed, and after each where asked."""

    logits: torch.Tensor  # (vocab,) float32, llama.cpp's
    timer: Elapsed
    position_logits: torch.Tensor | None = None  # (tokens fed, vocab)
    routes: dict[str, torch.Tensor] | None = None  # an MoE model's routing of the tokens fed (shared.routes)
    places: None = None

    def predictions(self, next_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        assert self.position_logits is not None, "every position's logits were not asked for"
        return predict_positions(self.position_logits, next_ids)


class LlamaPieces:
    """The text each token adds, from llama.cpp's vocabulary, decoded once per id and kept."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.known: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        known = self.known.get(token_id)
        if known is None:
            data = self.runtime.piece_bytes(token_id)
            try:
                known = safe_text(data.decode("utf-8"))
            except UnicodeDecodeError:  # a byte of a character: shown as its byte
                known = "".join(f"<0x{b:02X}>" for b in data)
            self.known[token_id] = known
        return known

    def learn(self, ids: Iterable[int]) -> None:
        for token_id in ids:
            self.piece(token_id)


CHAT_TEMPLATE = "tokenizer.chat_template"  # the GGUF's key for its Jinja chat template
OWN_HEAD = "output.weight"  # a GGUF's output head where it is not the token embeddings (tied: none)
FLASH_SAID = {"auto": "auto (llama.cpp's choice)", "on": "on", "off": "off"}  # (the model view's words)


@dataclass
class LlamaCppEngine(DenseInOnePlace):
    """A GGUF in llama.cpp as an engine. Not thread-safe: one thread owns it."""

    runtime: Runtime
    path: Path
    name: str
    header: GgufHeader | None = None  # the file's header as read before llama.cpp had it (its types)

    def __post_init__(self) -> None:
        runtime, shape = self.runtime, self.runtime.shape
        self.device = torch.device("cpu")  # the logits are read into the host's memory
        self.tokenizer = None  # no Hugging Face tokenizer here: a grammar stage reads llama.cpp's vocabulary
        self.intervening: LlamaIntervening | None = None
        self.edits = NO_EDITS  # what the interventions in force change, as llama.cpp takes it
        self._capture = False  # the journey's context to carry the evaluation callback (take_edits)
        self._reopen = False  # and to be opened again for it
        self._scoring: Runtime | None = None  # the context a text is scored in alone (full_scores), once made
        self.pieces = LlamaPieces(runtime)
        vocabulary = range(shape.vocab)
        self.eos_ids = {t for t in vocabulary if runtime.is_end(t)}
        self.special_ids = {t for t in vocabulary if runtime.is_control(t)} | self.eos_ids
        architecture = runtime.metadata("general.architecture") or "unknown"
        head_dim = int(runtime.metadata(f"{architecture}.attention.key_length") or shape.hidden // max(shape.heads, 1))
        self.kv_head_dim = int(runtime.metadata(f"{architecture}.attention.value_length") or head_dim)
        base = runtime.metadata(f"{architecture}.rope.freq_base")
        eps = runtime.metadata(f"{architecture}.attention.layer_norm_rms_epsilon")
        self.internals = LlamaInternals(runtime, self.path, architecture, eps)
        self.routers = moe_routers(self.header, architecture)  # an MoE model's (None: dense)
        self.chat_template = runtime.metadata(CHAT_TEMPLATE)
        # The file's type as people name it (Q4_K_M; llama.cpp's description says "Q4_K - Medium"), and its
        # tensors' types, which differ from it (a K-quant file falls back to Q5_0 or Q8_0 on narrow rows).
        named = self.header.file_type() if self.header else None
        quantization = named or shape.description.rsplit(" ", 1)[-1]
        types = f"; tensors: {self.header.types_said()}" if self.header and self.header.tensor_types else ""
        self.info = ModelInfo(
            name=self.name,
            device=placement_said(runtime.gpu_layers, shape.layers),
            dtype=quantization,
            layers=shape.layers,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            head_dim=head_dim,
            hidden=shape.hidden,
            vocab=shape.vocab,
            context=runtime.context_size,
            architecture=f"{architecture}, {shape.parameters / 1e6:,.0f}M parameters (counted), in llama.cpp",
            tied_embeddings=self.header is not None and OWN_HEAD not in self.header.tensor_names,
            positions=f"rotary (base {float(base):g})" if base else "as llama.cpp computes them",
            attention=f"llama.cpp's own, flash attention {FLASH_SAID[runtime.flash]}",
            chat_template=bool(self.chat_template),
            experts=self.routers.experts if self.routers else 0,
            quantization=f"{quantization} (GGUF, as llama.cpp runs it{types})",
            capabilities=in_order(
                {
                    Capability.STEP,
                    Capability.LENS,
                    Capability.ATTENTION,
                    Capability.INTERVENTIONS,
                    Capability.GRAMMAR,
                    Capability.CACHE,
                    Capability.FULL_SCORES,
                    Capability.RESIDUAL,
                }
                | ({Capability.ROUTING} if self.routers else set())
            ),
            distribution=WHOLE_VOCABULARY,
            runtime=f"llama.cpp (llama-cpp-python {version()}), {runtime.threads} CPU threads",
            threads=runtime.threads,
            lacks_why=tuple(LACKS_WHY.items()),
            reopen=self.reopen_command(),
        )

    def reopen_command(self) -> str:
        """How a person opens this GGUF in llama.cpp again, its attention as it ran."""
        model = "" if self.name == BUNDLED_NAME else f" --model {shlex.quote(self.name)}"
        flash = "" if self.runtime.flash == FLASH_ATTENTION[0] else f" --flash-attention {self.runtime.flash}"
        return f"tokenviz --backend llama.cpp{model}{flash}"

    # ---- the tokenizer ------------------------------------------------------------------------------

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return self.runtime.tokenize(text, special_tokens)

    def decode(self, ids: Iterable[int]) -> str:
        data = b"".join(self.runtime.piece_bytes(i) for i in ids)
        return data.decode("utf-8", "replace")

    def piece(self, token_id: int) -> str:
        return self.pieces.piece(token_id)

    def learn_pieces(self, ids: Iterable[int]) -> None:
        self.pieces.learn(ids)

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        """The conversation through the GGUF's own chat template (its Jinja, rendered as transformers renders
        a tokenizer's, sandboxed and bounded: hf.chat_template), tokenized as llama.cpp does with its special
        tokens read."""
        if not self.chat_template:
            raise TokenvizError(f"{self.name} has no chat template in its GGUF: drop --chat to give it plain text")
        messages = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": user}]
        bos, eos = self._named_token("bos"), self._named_token("eos")
        text = render_chat_template(self.chat_template, messages, bos_token=bos, eos_token=eos)
        ids = self.runtime.tokenize(text, special=False, parse_special=True)
        contents = [system or "", user]
        return ChatIds(ids, template_marks(ids, contents, lambda words: self.encode(words, special_tokens=False)))

    def _named_token(self, which: str) -> str:
        """The text of the GGUF's BOS or EOS token (a template writes it), or '' where it names none."""
        token = self.runtime.metadata(f"tokenizer.ggml.{which}_token_id")
        if token is None or not token.isdigit() or int(token) >= self.runtime.shape.vocab:
            return ""
        return self.runtime.piece_bytes(int(token)).decode("utf-8", "replace")

    def grammar_vocabulary(self) -> Any:
        """llama.cpp's vocabulary as llguidance reads it (its own llama.cpp support: each token's bytes, the
        control tokens marked, llama.cpp's tokenizer for the grammar's text), made once by the grammar stage."""
        import llguidance.llamacpp

        with warnings.catch_warnings():  # it asks each token's attributes by a name llama-cpp-python deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            return llguidance.llamacpp.lltokenizer_from_vocab(
                self.runtime.vocab_ptr, n_vocab=self.info.vocab, eos_token=sorted(self.eos_ids) or None
            )

    # ---- the cache ----------------------------------------------------------------------------------

    @property
    def fed(self) -> list[int]:
        """The tokens the journey's context holds, in order (as its runtime counts them)."""
        return self.runtime.held

    @property
    def cache(self) -> tuple[int, ...]:
        """The tokens the context holds: what use_cache goes on from."""
        return tuple(self.fed)

    @cache.setter
    def cache(self, tokens: Any) -> None:
        self.use_cache(tokens)

    @property
    def kv_len(self) -> int:
        return len(self.fed)

    @property
    def kv_bytes(self) -> int:
        """Keys and values of every layer at each position held, as llama.cpp keeps them (float16)."""
        shape = self.runtime.shape
        return len(self.fed) * kv_bytes_a_position(shape.layers, shape.kv_heads, self.info.head_dim, self.kv_head_dim)

    def use_cache(self, cache: Any) -> None:
        """Go on from the tokens `cache` names: what the context shares with them is kept, the rest fed."""
        tokens = list(cache)
        shared = shared_prefix(self.fed, tokens)
        self.crop(shared)
        if tokens[shared:]:
            self.forward(tokens[shared:])

    def reset(self) -> None:
        self.crop(0)

    def crop(self, length: int) -> None:
        if length > len(self.fed):
            raise ValueError(f"cannot crop a cache of {len(self.fed)} up to {length}")
        self._ready(keep=length)
        self.runtime.cut(length)

    def inspect(self, ask: LensAsk) -> list[Inspection]:
        return self.internals.inspect(self, ask)

    def residual(self, ids: Sequence[int], positions: Sequence[int], layer: int) -> torch.Tensor:
        return self.internals.residuals(ids, layer, positions, self.internals.edits)  # the interventions in force

    def through_head(self, vectors: torch.Tensor) -> torch.Tensor:
        return self.internals.head.logits(vectors)  # ggml's own kernels on the head as the GGUF holds it

    # ---- the cache read and fed again (verify, watching past steps, beams) -----------------------------

    def logits_after(self, ids: Sequence[int], start: int) -> torch.Tensor:
        return self.internals.logits_after(ids, start)

    # llama.cpp's sums depend on a pass's shape (internals.recompute): one batch of the whole context would
    # differ from the steps by that alone (0.07 in a probability on a K-quant), which is not the cache's doing.
    recomputed_as = "the whole context again from an empty cache, in passes of the journey's own shapes"

    def recompute(
        self, ids: list[int], chunk: int | None = None, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole of `ids` again from an empty cache (llama.cpp feeds it in batches of its own: `chunk` is
        a transformers pass's)."""
        return self.internals.recompute(ids, progress or (lambda done, total: None), cancelled or (lambda: False))

    def full_scores(self, ids: Sequence[int], first: int) -> torch.Tensor:
        """`ids` alone in a context of their own (kept for the next text: making one costs more than a small
        model's pass), as llama-perplexity feeds a window: one pass (llama.cpp's batches of 512), logits asked
        from `first` on, so llama.cpp computes the last layer at those positions alone."""
        logits, _ = self.internals.scores_kept(self._scoring_context(ids), ids, first, kept=False)
        return torch.from_numpy(logits)

    def full_scores_kept(self, ids: Sequence[int], first: int) -> tuple[torch.Tensor, Residuals]:
        """full_scores, and the residual after each layer at the same positions, captured in the same pass
        (internals.scores_kept): the lens there then costs no pass of its own."""
        logits, stream = self.internals.scores_kept(self._scoring_context(ids), ids, first)
        scores = torch.from_numpy(logits)
        return scores, Residuals(stream, tuple(ids[first:]), scores)

    def _scoring_context(self, ids: Sequence[int]) -> Runtime:
        """The context a text of `ids` is scored in alone (made once, larger when a longer text needs it)."""
        self.runtime.refuse_beside(self.edits, f"scoring a text of {len(ids):,} tokens", len(ids))
        if self._scoring is None or self._scoring.context_size < len(ids):
            self._scoring = self.runtime.sibling(self.internals.capture, context=len(ids))
        return self._scoring

    def lens_of(self, kept: Residuals, chosen: Sequence[int]) -> list[Inspection]:
        return self.internals.lens_of(self, kept, chosen)

    def beam_search(self, ask: SearchAsk, width: int) -> BeamResult:
        """Beam search from `ask.ids` on a context of its own (beams.py); `from_cache` changes nothing here:
        the context is fed again, as fast as llama.cpp's prefill."""
        from tokenviz.backends.llamacpp.beams import beam_search

        ids, said = list(ask.ids), (self.eos_ids, self.piece)
        return beam_search(self.runtime, self.edits, *said, ids, width, ask.steps, ask.is_cancelled, ask.tell)

    def speculate(
        self, ask: SearchAsk, drafter: str, settings: SamplingSettings, draft: Engine | None = None
    ) -> Speculation:
        """Speculative decoding from `ask.ids` on a context of its own (speculation.py), by prompt lookup."""
        from tokenviz.backends.llamacpp.speculation import speculate

        ids, said = list(ask.ids), (self.eos_ids, self.piece)
        return speculate(self.runtime, self.edits, *said, ids, drafter, ask.steps, settings, ask.is_cancelled, ask.tell)

    def attention(
        self, ids: Sequence[int], rows: range, layers: Sequence[int], cancelled: IsCancelled = None
    ) -> torch.Tensor:
        return self.internals.attention(ids, rows, layers, cancelled)

    # ---- interventions ------------------------------------------------------------------------------

    def intervene(
        self, interventions: Sequence[Intervention], context: Sequence[int], token_id: Callable[[str], int]
    ) -> LlamaIntervening:
        """Steering as llama.cpp's control vectors and patches as rows written (interventions.py), in force
        from the next pass on, the model's own distribution kept beside them."""
        intervening = LlamaIntervening(self, interventions, token_id)
        self.intervening = intervening
        intervening.apply()
        return intervening

    @cached_property
    def own_model(self) -> OwnModel:
        return OwnModel(self.runtime.sibling())

    def take_edits(self, edits: Edits) -> None:
        """The journey's passes and the views' with `edits` from the next pass on. Rows written need the
        evaluation callback on the journey's context, which it has only while a patch is in force, the
        lens is in use or the model routes to experts (without, a pass costs what llama.cpp's own decode
        costs): where it has none, the
        context is opened again at its next use (see _ready); a callback no longer needed goes at the next
        step (see _with_capture)."""
        self.edits = edits
        self.internals.edits = edits
        self._capture = bool(edits.writes) or (self._capture and self.intervening is not None)  # kept suspended
        self._reopen = self._capture and self.runtime.capture is None
        if not self._reopen:
            self.runtime.edit(edits)

    def _ready(self, keep: int | None = None) -> None:
        """Where the edits in force need the journey's context opened again: open it, and feed it the first
        `keep` tokens it held (all: None) under them."""
        if not self._reopen:
            return
        held = list(self.fed if keep is None else self.fed[:keep])
        runtime, self._reopen = self.runtime, False
        plan = runtime.shaped(held)  # fed again as they were: the journey's numbers stay its own
        runtime.open_context(Capture(runtime.lib.ggml_backend_sched_eval_callback) if self._capture else None)
        runtime.edit(self.edits)
        runtime.replay(plan, len(held))

    def _with_capture(self, wanted: bool) -> Capture | None:
        """The journey's context with an evaluation callback where a step reads tensors in its own pass
        (`wanted`: the lens's rows while it is in use, an MoE model's routing always), without one once it
        does not (unless a patch needs it): the context opened again, its cache kept (Runtime.reopen). The
        callback to read through, or None."""
        runtime = self.runtime
        if wanted and runtime.capture is None:
            runtime.reopen(Capture(runtime.lib.ggml_backend_sched_eval_callback))
        elif not wanted and runtime.capture is not None and not self._capture:
            runtime.reopen(None)
        return runtime.capture if wanted else None

    def joined(self, last: Forward, routes: Sequence[dict[str, Scores]], places: Sequence[TimesByPlace]) -> Forward:
        """The last pass over a prompt fed in chunks, with every chunk's routing joined (one place: none)."""
        assert isinstance(last, LlamaForward), last
        return dataclasses.replace(last, routes=join_routes(list(routes))) if routes else last

    def read_routing(self, host: Host) -> Routing | None:
        return read_routing(host, self.routers.layers) if self.routers else None

    def twin(self) -> LlamaCppEngine:
        return LlamaCppEngine(self.runtime.sibling(), self.path, self.name, self.header)

    # ---- a pass -------------------------------------------------------------------------------------

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> LlamaForward:
        """Feed `ids` after what the context holds: llama.cpp's logits after the last (and after each, with
        `every_position`). `cancelled` is asked before the pass (one llama_decode cannot stop inside)."""
        if cancelled is not None and cancelled():
            raise Cancelled()
        if len(self.fed) + len(ids) > self.runtime.context_size:
            raise TokenvizError(
                f"the context is full: {self.runtime.context_size:,} tokens (llama.cpp's context here); rewind"
            )
        self._ready()
        lens = self.internals.step_names(len(ids))
        routing = self.routers.names if self.routers else frozenset()
        wanted = lens | routing
        capture = self._with_capture(bool(wanted))
        if capture is not None:
            capture.start(wanted)
        started = time.perf_counter()
        try:
            rows = self.runtime.decode(ids, len(self.fed), every_position)
        finally:
            found = capture.stop() if capture is not None else {}
        milliseconds = (time.perf_counter() - started) * 1e3
        if lens:
            self.internals.keep(self.fed, found, rows[-1:])
        logits = torch.from_numpy(np.ascontiguousarray(rows[-1]))
        every = torch.from_numpy(rows) if every_position else None
        routes = self.routers.routes(found, len(ids)) if self.routers else None
        return LlamaForward(logits, Elapsed(milliseconds), every, routes)


def conforms(
    engine: LlamaCppEngine,
) -> tuple[
    Engine, AttentionRows, Lens, Intervenable, OwnGrammarVocabulary, Caching, FullScores, LensOfScores, ResidualStream
]:
    """The contract's protocols a llama.cpp engine declares, checked by mypy here."""
    return engine, engine, engine, engine, engine, engine, engine, engine, engine
