"""The engine of a model a server runs (vLLM's OpenAI-compatible server): a contract.engine Engine
drawing its own tokens (a DrawingEngine), with leave-one-out, and where the server exposes them the
lens, attention rows and interventions (Lens, AttentionRows, Intervenable); no cache here.

A step is one request for one token: the journey's tokens as ids, the live settings as the request's
fields, the top-N log-probabilities asked for. Feeding tokens sends nothing (the server keeps no state
between requests; its prefix cache makes the next request cheap); rewinding and branching only cut the
tokens kept here. The tokens are the server's own (/tokenize, /detokenize); the vocabulary's size is
found by asking /detokenize where the ids end, the context from /v1/models. What the server exposes is
asked at connection (one request, backends.served.internals.probe): with the vllm-lens plugin there and
the model's directory here, the lens, attention rows and steering (backends.served.steering) are
capabilities too; what is not exposed (the cache, gradients, a head's ablation…) is left out, so its keys
say so in one line (ModelInfo.internals: why).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokenviz.backends.served.completions import (
    REPRODUCED_WITHIN,
    TOP_N,
    ServedChoice,
    answered,
    checked_logprob,
    checked_rank,
    choice_of,
    complete,
    logprobs_are_raw,
    sampling_fields,
    served_model_name,
    top_of,
)
from tokenviz.backends.served.head_from_files import OutputHead, checked_files, load_head
from tokenviz.backends.served.internals import INSTALL, PLUGIN, Plugin, ServedInternals, probe
from tokenviz.backends.served.steering import ServedSteering, request_fields
from tokenviz.backends.shared.chat_marks import template_marks
from tokenviz.backends.shared.endpoint import Endpoint, EndpointError, NoAnswer
from tokenviz.backends.shared.token_texts import TokenPieces
from tokenviz.contract.backend import Progress
from tokenviz.contract.engine import (
    AttentionRows,
    Attributing,
    Capability,
    ChatIds,
    DenseInOnePlace,
    DrawingEngine,
    Elapsed,
    Intervenable,
    IsCancelled,
    Lens,
    OnProgress,
    ResidualStream,
    in_order,
    refusal_of,
)
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import Drawn, Inspection, LensAsk
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.decoding.drawn import prompt_columns
from tokenviz.decoding.prompt_predictions import TOP

PROBE = "The Eiffel Tower is located in Paris.\n 1234 naïve 東京 🙂"  # a local tokenizer checked on this
MAX_VOCABULARY = 1 << 22  # ids asked past this are not looked for: no tokenizer is that large
CONNECT_PHASE_S = 180.0  # everything asked of a server before its first step (a cold one's first completion is slow)
MAX_CONTEXT = 1 << 20  # a context a server's /v1/models may claim (past it, or none: unknown, taken as this)
SEED_STRIDE = 1_000_003  # a step's seed: the journey's seed and the position, as the local draw's u


@dataclass
class ServedForward:
    """Tokens fed to a served model: no request until a prediction or a draw is asked for."""

    engine: ServedEngine
    context: tuple[int, ...]  # every token fed, these included
    start: int  # where these began
    timer: Elapsed = field(default_factory=Elapsed)
    logits: None = None  # a served model's distribution comes with its draw
    routes: None = None
    places: None = None

    def predictions(self, next_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """The server's predictions after each of these positions, of `next_ids` (one request)."""
        started = time.perf_counter()
        ids = [*self.context[: self.start + 1], *next_ids]
        entries = self.engine.prompt_logprobs(ids, TOP)[self.start + 1 :]
        self.timer.milliseconds += (time.perf_counter() - started) * 1e3
        return prompt_columns(entries, next_ids, TOP)


def tokenizer_here(files: str) -> Any:
    """The tokenizer of --tokenizer (an id or the model's directory), a directory's files and config
    checked first (backends.served.head_from_files.checked_files: the tokenizer reads the config too)."""
    from tokenviz.backends.shared.tokenizer import load_tokenizer

    if Path(files).expanduser().is_dir():
        checked_files(Path(files).expanduser())
    return load_tokenizer(files)


class ServedPieces:
    """Token ids as the server decodes each alone (asked once per token, kept)."""

    def __init__(self, engine: ServedEngine):
        self.engine = engine
        self.known: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        if token_id not in self.known:
            self.known[token_id] = safe_text(self.engine.detokenize([token_id]))
        return self.known[token_id]

    def learn(self, ids: Iterable[int]) -> None:
        for token in set(ids):
            self.piece(token)


class ServedEngine(DenseInOnePlace):
    """A served model as an engine (see the module's docstring). One thread owns it."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        top_n: int = TOP_N,
        local_tokenizer: Any = None,
        model_files: str | None = None,
    ):
        """`local_tokenizer`: a Hugging Face tokenizer here to tokenize and decode with (no request a
        piece), checked once to tokenize as the server does; without one, the server's own. `model_files`:
        the model's directory, where its final norm and unembedding are read (backends.served.head_from_files) for the
        lens and attention rows of a server with the vllm-lens plugin (one request at connection asks what
        the server exposes; the head is read only then)."""
        self.endpoint, self.model, self.top_n = endpoint, model, top_n
        self.local = local_tokenizer
        self.device = torch.device("cpu")  # where the scores made of its answers live
        self.tokenizer = local_tokenizer  # --tokenizer's: counting tokens; the server draws, so no grammar stage
        self.cache: tuple[int, ...] = ()  # the tokens fed (the server keeps nothing between requests)
        self.pieces: ServedPieces | TokenPieces = (
            ServedPieces(self) if local_tokenizer is None else TokenPieces(local_tokenizer)
        )
        self.raw: bool | None = None  # its log-probabilities are before the sampling settings (see draw)
        self.steering: ServedSteering | None = None  # the interventions in force (see intervene)
        self._fields: dict[str, Any] = {"temperature": 0}  # the last draw's request fields (see own_top)
        with endpoint.phase(CONNECT_PHASE_S, "connecting"):  # one deadline, however many requests
            listed = endpoint.get("/models")
            entries = listed.get("data", []) if isinstance(listed, dict) else []
            entry = next((m for m in entries if isinstance(m, dict) and m.get("id") == model), {})
            context = entry.get("max_model_len")
            bos = self.encode("", special_tokens=True)
            self.vocab = vocab = self._vocabulary() if local_tokenizer is None else self._checked(local_tokenizer)
            # the tokenizer here names them all, as a local model's does; the server's says only its BOS
            self.special_ids: set[int] = set(bos) | set(getattr(local_tokenizer, "all_special_ids", None) or ())
            self.eos_ids: set[int] = set()  # learnt: a token the server stopped on without a stop string
            plugin = probe(endpoint, model, bos or self.encode("The", special_tokens=False))
            head = load_head(model_files) if plugin.residual else None
            self.internals = (
                ServedInternals(endpoint, model, head, plugin, self._steering_fields)
                if plugin.residual and head
                else None
            )
            if head is not None and head.vocab < vocab:  # a head padded past the tokenizer is usual
                raise TokenvizError(
                    f"--tokenizer's model has {head.vocab:,} rows in its head, the server {vocab:,} tokens"
                )
            capabilities = {Capability.STEP, Capability.LEAVE_ONE_OUT}
            if local_tokenizer is not None:
                capabilities.add(Capability.TOKENIZER)
            if self.internals is not None:
                capabilities |= {
                    Capability.LENS,
                    Capability.INTERVENTIONS,
                    Capability.RESIDUAL,
                    *([Capability.ATTENTION] if plugin.qk else []),
                }
            shape = self.internals  # the model's shape, where it is read
            lacking_internals = missing(plugin, head)  # why its insides are not read, and what reads them
            shown = endpoint.masked(model)  # a server may list the key as its model's id: never shown or saved
            server = self._server_name()
            self.info = ModelInfo(
                name=shown,
                device=f"served at {endpoint.host}",
                dtype="as served",
                layers=shape.head.layers if shape else 0,
                heads=shape.heads if shape else 0,
                kv_heads=shape.kv_heads if shape else 0,
                head_dim=shape.head_dim if shape else 0,
                hidden=shape.head.hidden if shape else 0,
                vocab=vocab,
                context=context if type(context) is int and 0 < context <= MAX_CONTEXT else MAX_CONTEXT,
                architecture=f"{shown} on {server} ({endpoint.url})",
                tied_embeddings=bool(head and getattr(head.config, "tie_word_embeddings", False)),
                positions="not exposed by the server",
                attention=f"the server's ({PLUGIN}: queries and keys replayed here)" if shape else "the server's",
                chat_template=self._has_chat_template(),
                capabilities=in_order(capabilities),
                distribution=distribution(top_n, None),
                runtime=f"{server}, a request a step" + (f", its insides through {PLUGIN}" if shape else ""),
                requests=f"the server at {endpoint.host}",
                numbers_of="the server",
                reopen=f"tokenviz --endpoint URL (the server at {endpoint.host})",
                reproduced_within=REPRODUCED_WITHIN,
                covers=top_n,
                draws="the server, with the settings sent",
                internals=lacking_internals,
                lacks_why=lacks_why(capabilities, lacking_internals),
                details=(("each step", EACH_STEP), *seen_inside(shape)),
            )

    @classmethod
    def open(cls, choice: ServedChoice, files: str | None = None, progress: Progress | None = None) -> ServedEngine:
        """The engine on the server `choice` names (checked to answer, the model to be served); with
        `files` (--tokenizer: an id or the model's directory) its tokenizer here, and its head; what its
        requests wait on told to `progress` (Endpoint.tell)."""
        endpoint = choice.connect()
        if progress is not None:
            endpoint.tell(progress)
        here = tokenizer_here(files) if files is not None else None
        return cls(endpoint, served_model_name(endpoint, choice.model), local_tokenizer=here, model_files=files)

    # ---- the server's tokenizer ------------------------------------------------------------------

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        if self.local is not None:
            return list(self.local(text, add_special_tokens=special_tokens)["input_ids"])
        return self._server_encode(text, special_tokens)

    def _server_encode(self, text: str, special_tokens: bool = True) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": special_tokens}
        return _token_list(self.endpoint.post("/tokenize", body, root=True), self.endpoint.host)

    def detokenize(self, ids: Sequence[int]) -> str:
        answer = self.endpoint.post("/detokenize", {"model": self.model, "tokens": list(ids)}, root=True)
        text = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise EndpointError(f"{self.endpoint.host}'s /detokenize did not answer with text")
        return text

    def decode(self, ids: Iterable[int]) -> str:
        if isinstance(self.pieces, TokenPieces):
            return self.pieces.decode(ids)
        ids = list(ids)
        return safe_text(self.detokenize(ids)) if ids else ""

    def piece(self, token_id: int) -> str:
        return self.pieces.piece(token_id)

    def learn_pieces(self, ids: Iterable[int]) -> None:
        self.pieces.learn(ids)

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        """The conversation through the server's chat template; the ids outside the messages' own
        words are the template's."""
        messages = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": user}]
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        ids = _token_list(self.endpoint.post("/tokenize", body, root=True), self.endpoint.host)
        contents = [system or "", user]
        return ChatIds(ids, template_marks(ids, contents, lambda words: self.encode(words, special_tokens=False)))

    def _server_name(self) -> str:
        """The server and its version where it says (vLLM's /version), else what it is known to be."""
        try:
            version = self.endpoint.get("/version", root=True)
        except NoAnswer:
            raise
        except EndpointError:
            return "an OpenAI-compatible server"
        said = version.get("version") if isinstance(version, dict) else None
        return f"vLLM {safe_text(said)[:40]}" if isinstance(said, str) else "an OpenAI-compatible server"

    def _has_chat_template(self) -> bool:
        try:
            self.endpoint.post(
                "/tokenize", {"model": self.model, "messages": [{"role": "user", "content": "hi"}]}, True
            )
        except NoAnswer:
            raise
        except EndpointError:
            return False
        return True

    def _checked(self, tokenizer: Any) -> int:
        """The local tokenizer's vocabulary, once it is shown to tokenize and decode as the server does."""
        here = list(tokenizer(PROBE, add_special_tokens=True)["input_ids"])
        there = self._server_encode(PROBE)
        if here != there:
            raise TokenvizError(
                f"--tokenizer does not tokenize as {self.endpoint.host} does: a test text is {len(here)} tokens "
                f"here and {len(there)} there (first difference at token {_first_difference(here, there)})"
            )
        vocab = len(tokenizer)
        if not self.detokenize([vocab - 1]) or self.detokenize([vocab]):
            raise TokenvizError(f"--tokenizer has {vocab:,} tokens, and {self.endpoint.host}'s tokenizer does not")
        return vocab

    def _vocabulary(self) -> int:
        """How many ids the server's tokenizer has: past the last, /detokenize answers nothing."""

        def known(token: int) -> bool:  # a server that refuses an id past its vocabulary says the same
            try:
                return bool(self.detokenize([token]))
            except NoAnswer:
                raise  # each of a silent server's deadlines was swallowed here: 344 s of silence
            except EndpointError:
                return False

        high = 1024
        while known(high) and high < MAX_VOCABULARY:
            high *= 2
        low = high // 2 if high > 1024 else 0  # a known id (or 0)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if known(middle) else (low, middle)
        return high

    # ---- feeding tokens --------------------------------------------------------------------------

    @property
    def kv_len(self) -> int:
        return len(self.cache)

    @property
    def kv_bytes(self) -> int:
        return 0  # the server's cache is its own

    def use_cache(self, cache: Any) -> None:
        self.cache = tuple(cache)

    def reset(self) -> None:
        self.cache = ()

    def crop(self, length: int) -> None:
        self.cache = self.cache[:length]

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> ServedForward:
        """The tokens kept to send with the next request (nothing runs here: no layers to ask between)."""
        start = len(self.cache)
        self.cache = (*self.cache, *ids)
        return ServedForward(self, self.cache, start)

    def twin(self) -> ServedEngine:
        other = copy.copy(self)
        other.cache = ()
        return other

    # ---- requests ----------------------------------------------------------------------------------

    def _answered(
        self,
        ids: Sequence[int],
        fields: dict[str, Any],
        logprobs: int,
        xargs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The whole answer to one request over `ids`, with the interventions in force and the plugin's `xargs`."""
        steered = self._steering_fields(ids, xargs or {})
        return answered(self.endpoint, self.model, ids, fields, logprobs, **steered, **extra)

    def _complete(self, ids: Sequence[int], fields: dict[str, Any], logprobs: int, **extra: Any) -> dict[str, Any]:
        return choice_of(self._answered(ids, fields, logprobs, **extra), self.endpoint.host)

    def steering_in_force(self) -> ServedSteering | None:
        """The interventions sent with each request now (None: none, or set aside for the model's own)."""
        return self.steering if self.steering is not None and self.steering.active else None

    def _steering_fields(self, ids: Sequence[int], xargs: dict[str, Any]) -> dict[str, Any]:
        """A request's extra fields over `ids`: the plugin's `xargs`, and the steering vectors in force with
        their cache salt (backends.served.steering)."""
        steering = self.steering_in_force()
        return request_fields(steering.vectors(ids) if steering is not None else [], xargs)

    def _top(self, choice: dict[str, Any]) -> tuple[int, float, list[tuple[int, float]]]:
        chosen, logprob, top = top_of(choice, self.endpoint.host, self.top_n)
        self._check([chosen, *(t for t, _ in top)])
        return chosen, logprob, top

    def _check(self, tokens: Iterable[int]) -> None:
        """Refuse an id past the vocabulary (the numbers are checked as they are read)."""
        for token in tokens:
            if not 0 <= token < self.vocab:
                raise EndpointError(f"{self.endpoint.host} answered token id {token}, past its vocabulary")

    def own_top(self, ids: Sequence[int]) -> Drawn:
        """The server's top N after `ids` with no intervention sent (the model's own), asked with the last
        draw's settings: where its log-probabilities are after the settings, both are."""
        started = time.perf_counter()
        choice = complete(self.endpoint, self.model, ids, self._fields, self.top_n)
        ms = (time.perf_counter() - started) * 1e3
        chosen, logprob, top = self._top(choice)
        rank = next((i for i, (t, _) in enumerate(top, 1) if t == chosen), 1)
        return Drawn(chosen, logprob, rank, tuple(top), bool(self.raw), ms)

    def intervene(
        self, interventions: Sequence[Intervention], context: Sequence[int], token_id: Callable[[str], int]
    ) -> ServedSteering:
        """The interventions resolved on the model's own passes and sent with every request from now on
        (backends.served.steering; a head ablation is refused: it would mean sending code)."""
        if (line := refusal_of(self.info, Capability.INTERVENTIONS, interventions[0].label)) is not None:
            raise TokenvizError(line)
        steering = ServedSteering(self, interventions, token_id)
        self.steering = steering
        return steering

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        if self.raw is None:  # measured once, at the journey's first context; the model view says which
            self.raw = logprobs_are_raw(self.endpoint, self.model, ids)
            self.info = dataclasses.replace(self.info, distribution=distribution(self.top_n, self.raw))
        fields = sampling_fields(settings) | {"seed": (settings.seed * SEED_STRIDE + len(ids)) % (1 << 31)}
        self._fields = fields
        xargs, size = self.internals.step_xargs(len(ids)) if self.internals is not None else ({}, 0)  # the lens
        started = time.perf_counter()
        answer = self._answered(ids, fields, self.top_n, xargs, activation_bytes=size)
        choice = choice_of(answer, self.endpoint.host)
        ms = (time.perf_counter() - started) * 1e3
        chosen, logprob, top = self._top(choice)
        rank = next((i for i, (t, _) in enumerate(top, 1) if t == chosen), None)
        if rank is None:
            logprob, rank = self.logprob_of(ids, chosen)
        if xargs and self.internals is not None:
            self.internals.keep(ids, self.steering_in_force(), answer, (chosen, logprob))
        finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
        if finish == "stop" and not any(s in self.piece(chosen) for s in settings.stop):
            self.eos_ids.add(chosen)  # the server stopped on this token itself: its end of sequence
        return Drawn(chosen, logprob, rank, tuple(top), bool(self.raw), ms, finish)

    # ---- internals (the vllm-lens plugin) ----------------------------------------------------------

    def inspect(self, ask: LensAsk) -> list[Inspection]:
        assert self.internals is not None  # asked only behind the lens capability
        return self.internals.inspect(self, ask)

    def residual(self, ids: Sequence[int], positions: Sequence[int], layer: int) -> torch.Tensor:
        """The residual the server computed after `layer` at `positions` (one request up to the last), the
        steering in force sent with it."""
        assert self.internals is not None  # asked only behind the residual's capability
        stream = self.internals.residual(list(ids[: max(positions) + 1]), layer)
        return torch.as_tensor(stream[list(positions)])

    def through_head(self, vectors: torch.Tensor) -> torch.Tensor:
        """The model's final norm and head, read here from its files (the server keeps its own)."""
        assert self.internals is not None  # asked only behind the residual's capability
        return self.internals.head.logits(vectors)

    def attention(
        self, ids: Sequence[int], rows: range, layers: Sequence[int], cancelled: IsCancelled = None
    ) -> torch.Tensor:
        assert self.internals is not None  # asked only behind the attention rows' capability
        if cancelled is not None and cancelled():  # (one request: asked before it)
            raise Cancelled("the attention rows were set aside")
        return self.internals.attention(ids, rows, layers)

    def attribute(
        self, ids: list[int], target: int, method: str, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[float, list[float]]:
        """Leave-one-out, as the local backend's: log p(target | ids), and for each position that minus
        log p(target | ids without it), in the server's own distribution: one request a position."""
        if method != "loo":
            raise TokenvizError("gradient × input needs the model's weights: a served model gives leave-one-out only")
        if len(ids) < 2:
            raise TokenvizError("leave-one-out needs at least two tokens of context")
        full = self.logprob_of(ids, target)[0]
        scores = []
        for j in range(len(ids)):
            if cancelled is not None and cancelled():
                raise Cancelled("attribution cancelled")
            scores.append(full - self.logprob_of([*ids[:j], *ids[j + 1 :]], target)[0])
            if progress is not None:
                progress(j + 1, len(ids))
        return full, scores

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        entry = self.prompt_logprobs([*ids, token], 0)[-1]
        return entry[token]

    def prompt_logprobs(self, ids: Sequence[int], top: int) -> list[dict[int, tuple[float, int]]]:
        """For each token after the first: {id: (logprob, rank)} of its top `top` and itself."""
        choice = self._complete(ids, {"temperature": 0}, 1, prompt_logprobs=top)
        entries = choice.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise EndpointError(f"{self.endpoint.host} did not give the prompt's log-probabilities")
        out: list[dict[int, tuple[float, int]]] = [{}]
        host = self.endpoint.host
        try:
            for entry, own in zip(entries[1:], ids[1:]):
                read = {
                    int(k): (checked_logprob(v["logprob"], host, True), checked_rank(v["rank"], host, self.vocab))
                    for k, v in entry.items()
                }
                assert own in read
                self._check(read.keys())
                out.append(read)
        except (KeyError, TypeError, ValueError, AttributeError, AssertionError):
            raise EndpointError(f"{self.endpoint.host} gave a prompt_logprobs entry tokenviz cannot read") from None
        return out


def distribution(top_n: int, raw: bool | None) -> str:
    """What a served model's distribution is, as the model view and the next-token pane say it."""
    mode = {None: "not measured yet", True: "before the sampling settings (raw)"}.get(
        raw, "after the server's settings"
    )
    return f"the server's top {top_n} log-probabilities, {mode}; the rest of the vocabulary unknown"


def missing(plugin: Plugin, head: OutputHead | None) -> str:
    """Why a served model's internals are not shown, and how to have them ('' when they are)."""
    if not plugin.residual:
        return f"its server has no {PLUGIN} plugin ({INSTALL})"
    if head is None:
        return "give --tokenizer DIR (the model's directory: the lens reads its final norm and unembedding there)"
    return "" if plugin.qk else f"its {PLUGIN} sends no queries and keys"


EACH_STEP = "one request: the tokens as ids, the settings as its fields; drawn by the server, with the settings sent"
NEVER = ("never", "its KV cache (the server's own), gradients, a head's ablation (it would mean sending code)")


def seen_inside(shape: object | None) -> tuple[tuple[str, str], ...]:
    """The model view's rows on what of a served model's inside is read here, and what never is."""
    inside = (("inside", f"the lens, attention rows and steering, read through the server's {PLUGIN}"),)
    return (*(inside if shape else ()), NEVER)


MAY_EXPOSE = frozenset(
    {Capability.ATTENTION, Capability.LENS, Capability.INTERVENTIONS, Capability.RESIDUAL}
)  # through a plugin
NOT_SERVED = "a server does not expose it (it needs the model in this process)"


def lacks_why(capabilities: set[Capability], internals: str) -> tuple[tuple[str, str], ...]:
    """Why a served model lacks each capability it lacks (ModelInfo.lacks_why): what its server may
    expose but does not (`internals`: why not, and what gives it, as an aside) and what no server can.
    A grammar's is said from who draws (ModelInfo.draws)."""
    said = []
    for capability in Capability:
        if capability in capabilities or capability is Capability.GRAMMAR:
            continue
        if capability is Capability.CACHE:
            why = "a server keeps its own KV cache: tokenviz cannot read it"
        elif capability is Capability.ABLATION:  # steering and patching go with a request; a head's hook would not
            why = "a head cannot be ablated inside a server; steering and patching work (it would need a hook there)"
        else:
            why = f"on a served model, {internals if capability in MAY_EXPOSE and internals else NOT_SERVED}"
        said.append((capability.value, why))
    return tuple(said)


def _token_list(answer: Any, host: str) -> list[int]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):  # a bool is an int
        raise EndpointError(f"{host}'s /tokenize did not answer with token ids")
    return tokens


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def conforms(
    engine: ServedEngine,
) -> tuple[DrawingEngine, AttentionRows, Lens, Attributing, Intervenable, ResidualStream]:
    """The contract's protocols a served engine may declare (by what its server gives), checked by mypy here."""
    return engine, engine, engine, engine, engine, engine
