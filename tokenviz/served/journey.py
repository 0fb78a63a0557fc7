"""A journey on a model a server runs: one request per token, the journey's tokens sent as ids and the
sampling settings as the request's fields, the server's own top-N log-probabilities kept as they came.

What a served model shows is labelled for what it is: the top-N the server returned (not the whole
vocabulary), before or after the sampling settings as measured once at the start (two requests that
differ only in temperature: equal log-probabilities mean the server returns the raw distribution),
each request's latency (not a forward pass). The tokens are the server's own (/tokenize, /detokenize).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenviz.contract.errors import PromptError, TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import safe_text
from tokenviz.served.endpoint import ApiKey, Endpoint, EndpointError, Say, connect

TOP_N = 20  # the server's top log-probabilities asked for each step (vLLM allows up to --max-logprobs)
ID_PREFIX = "token_id:"  # how vLLM names a token with return_tokens_as_token_ids
RAW_TOLERANCE = 1e-4  # log-probabilities equal at two temperatures within this: the raw distribution

REPRODUCED_WITHIN = 1e-3  # nats: a served model's log-probabilities asked again (vLLM's float32 kernels: 4e-5)
LOGPROB_SLACK = 1e-3  # a log-probability above 0 by no more than this is float rounding: taken as 0
MOST_RANK = 10**8  # a rank past this is past any vocabulary: refused where the vocabulary is unknown

RAW = "raw: the model's distribution before the sampling settings"
PROCESSED = "processed: after the sampling settings (the server's logprobs mode)"


@dataclass(frozen=True)
class ServedCandidate:
    id: int
    text: str
    logprob: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "logprob": self.logprob, "prob": math.exp(self.logprob)}


@dataclass(frozen=True)
class ServedStep:
    index: int
    position: int
    chosen: ServedCandidate
    rank: int  # of the chosen token in the distribution returned (from the top-N, else from prompt_logprobs)
    top: tuple[ServedCandidate, ...]
    request_ms: float
    finish: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "position": self.position,
            "chosen": {**self.chosen.to_json(), "rank": self.rank},
            "top": [c.to_json() for c in self.top],
            "ms": {"request": self.request_ms},
        }


def checked_logprob(value: Any, host: str, masked_ok: bool = False) -> float:
    """A log-probability as a server sent it, refused in one line unless it is a number no greater than
    0 (LOGPROB_SLACK allowed, taken as 0): finite, or -inf where `masked_ok` (a token a setting ruled out)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EndpointError(f"{host} answered a log-probability that is not a number")
    logprob = float(value)
    if math.isnan(logprob) or logprob > LOGPROB_SLACK or (logprob == -math.inf and not masked_ok):
        raise EndpointError(f"{host} answered a log-probability of {logprob:g}: not one of a distribution")
    return min(logprob, 0.0)


def checked_rank(value: Any, host: str, most: int | None = None) -> int:
    """A rank as a server sent it: a positive integer within the vocabulary (`most`, where known)."""
    limit = most if most is not None else MOST_RANK
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise EndpointError(f"{host} answered a rank of {safe_text(str(value)[:40])}: not one within the vocabulary")
    return value


def served_model_name(endpoint: Endpoint, given: str | None) -> str:
    """The model to ask for: `given` (checked to be served), else the one the server lists."""
    listed = endpoint.get("/models")
    entries = listed.get("data", []) if isinstance(listed, dict) else []
    names: list[str] = [m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not names:
        raise EndpointError(f"{endpoint.host} lists no model at /v1/models")
    shown = ", ".join(safe_text(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if given is not None and given not in names:
        raise TokenvizError(f"{endpoint.host} does not serve {safe_text(given)!r}; it serves {shown}")
    if given is None and len(names) > 1:
        raise TokenvizError(f"{endpoint.host} serves several models ({shown}): choose one with --served-model")
    return given or names[0]


@dataclass(frozen=True)
class ServedChoice:
    """Which server, which of its models, and how to prove who asks: the options a served command takes."""

    url: str
    model: str | None = None  # None: the one the server lists
    api_key: ApiKey = field(default_factory=ApiKey)
    insecure_http: bool = False  # the key may go over plain http to another machine

    def connect(self, say: Say = lambda line: None) -> Endpoint:
        """The server, checked to answer (within seconds) before anything else waits on it."""
        return connect(self.url, self.api_key, self.insecure_http, say)

    def open(self, settings: SamplingSettings, say: Say = lambda line: None) -> ServedJourney:
        """A journey on the served model (the server checked to answer, the model to be served)."""
        endpoint = self.connect(say)
        return ServedJourney(endpoint, served_model_name(endpoint, self.model), settings)


def sampling_fields(settings: SamplingSettings) -> dict[str, Any]:
    """The settings as an OpenAI-compatible completion request's fields (vLLM's extensions included)."""
    return {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k if settings.top_k > 0 else -1,
        "min_p": settings.min_p,
        "repetition_penalty": settings.repetition_penalty,
        "presence_penalty": settings.presence_penalty,
        "frequency_penalty": settings.frequency_penalty,
        "seed": settings.seed,
        **({"stop": list(settings.stop)} if settings.stop else {}),
    }


def complete(
    endpoint: Endpoint, model: str, ids: Sequence[int], fields: dict[str, Any], logprobs: int, **extra: Any
) -> dict[str, Any]:
    """One completion of one token after `ids` (sent as ids), with `fields`, the top `logprobs` named by
    token id: the answer's choice. (A served journey's and the served engine's one request.)"""
    return choice_of(answered(endpoint, model, ids, fields, logprobs, **extra), endpoint.host)


def answered(
    endpoint: Endpoint, model: str, ids: Sequence[int], fields: dict[str, Any], logprobs: int, **extra: Any
) -> dict[str, Any]:
    """The whole answer to `complete`'s request (where the plugin's activations are)."""
    body = {"model": model, "prompt": list(ids), "max_tokens": 1, "logprobs": logprobs}
    body |= {"return_tokens_as_token_ids": True, **fields, **extra}
    answer = endpoint.post("/completions", body)
    if not isinstance(answer, dict):
        raise EndpointError(f"{endpoint.host} answered /v1/completions with no object")
    return answer


def choice_of(answer: dict[str, Any], host: str) -> dict[str, Any]:
    """An answer's one choice."""
    try:
        choice = answer["choices"][0]
        assert isinstance(choice, dict)
        return choice
    except (KeyError, IndexError, TypeError, AssertionError):
        raise EndpointError(f"{host} answered /v1/completions without a choice") from None


def top_of(choice: dict[str, Any], host: str, top_n: int) -> tuple[int, float, list[tuple[int, float]]]:
    """(chosen id, its logprob, [(id, logprob)] the top-N, best first) from a completion's choice, every
    number checked; the top cut to the `top_n` asked and the chosen token (vLLM adds it when it lies
    past them) before anything is done for each entry."""
    try:
        logprobs = choice["logprobs"]
        chosen = token_id(logprobs["tokens"][0])
        logprob = checked_logprob(logprobs["token_logprobs"][0], host)
        entries = logprobs["top_logprobs"][0].items()
        top = sorted(((token_id(k), checked_logprob(v, host, True)) for k, v in entries), key=lambda t: -t[1])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise EndpointError(
            f"{host} answered without token-id log-probabilities (is it vLLM's OpenAI server?)"
        ) from None
    return chosen, logprob, top[: top_n + 1]


def logprobs_are_raw(endpoint: Endpoint, model: str, ids: Sequence[int]) -> bool:
    """Whether the server's log-probabilities are before its sampling settings: the same request at
    two temperatures, everything else the same, gives the same ones."""
    fields = {"seed": 0, "top_p": 1.0, "top_k": -1}
    warm, cool = (
        dict(top_of(complete(endpoint, model, ids, {**fields, "temperature": t}, 5), endpoint.host, 5)[2])
        for t in (1.0, 0.5)
    )
    return warm.keys() == cool.keys() and all(abs(warm[t] - lp) <= RAW_TOLERANCE for t, lp in cool.items())


class ServedJourney:
    """The journey's tokens and steps on a served model, a request per token."""

    def __init__(self, endpoint: Endpoint, model: str, settings: SamplingSettings, top_n: int = TOP_N):
        if settings.grammar is not None:
            raise TokenvizError("a served model's grammar stage is not shown yet: drop the grammar option")
        self.endpoint, self.model, self.settings, self.top_n = endpoint, model, settings, top_n
        self.prompt = ""
        self.prompt_ids: list[int] = []
        self.ids: list[int] = []
        self.steps: list[ServedStep] = []
        self.stop_reason: str | None = None
        self.distribution = "unknown"
        self._pieces: dict[int, str] = {}

    # ---- the server's tokenizer ------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        answer = self.endpoint.post("/tokenize", {"model": self.model, "prompt": text}, root=True)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise EndpointError(f"{self.endpoint.host}'s /tokenize did not answer with token ids")
        return tokens

    def piece(self, token: int) -> str:
        """A token's text as the server decodes it alone (asked once per token)."""
        if token not in self._pieces:
            answer = self.endpoint.post("/detokenize", {"model": self.model, "tokens": [token]}, root=True)
            text = answer.get("prompt") if isinstance(answer, dict) else None
            if not isinstance(text, str):
                raise EndpointError(f"{self.endpoint.host}'s /detokenize did not answer with text")
            self._pieces[token] = safe_text(text)
        return self._pieces[token]

    # ---- the journey -------------------------------------------------------------------------------

    def start(self, prompt: str) -> None:
        ids = self.encode(prompt)
        if not ids:
            raise PromptError("the prompt is empty: type some text to start from")
        self.prompt, self.prompt_ids, self.ids = prompt, ids, list(ids)
        self.steps, self.stop_reason = [], None
        self.distribution = self._measured_distribution()

    def _complete(self, ids: list[int], fields: dict[str, Any], logprobs: int, **extra: Any) -> dict[str, Any]:
        return complete(self.endpoint, self.model, ids, fields, logprobs, **extra)

    def _top(self, choice: dict[str, Any]) -> tuple[int, float, list[tuple[int, float]]]:
        return top_of(choice, self.endpoint.host, self.top_n)

    def _measured_distribution(self) -> str:
        """Whether the server's log-probabilities are before the sampling settings or after."""
        return RAW if logprobs_are_raw(self.endpoint, self.model, self.prompt_ids) else PROCESSED

    def step(self) -> ServedStep | None:
        """One token from the server at the journey's context; None once it has stopped."""
        if self.stop_reason is not None:
            return None
        step = self.predict(self.ids, len(self.steps))
        self.steps.append(step)
        self.ids.append(step.chosen.id)
        generated = len(self.ids) - len(self.prompt_ids)
        if step.finish == "stop":
            self.stop_reason = "the server stopped (end of sequence or a stop string)"
        elif generated >= self.settings.max_new_tokens:
            self.stop_reason = f"max new tokens ({self.settings.max_new_tokens})"
        return step

    def predict(self, ids: list[int], index: int = 0) -> ServedStep:
        """The server's next token after `ids`, with the journey's settings (the journey unchanged)."""
        started = time.perf_counter()
        choice = self._complete(ids, sampling_fields(self.settings), self.top_n)
        request_ms = (time.perf_counter() - started) * 1e3
        chosen, logprob, top = self._top(choice)
        rank = self.rank_of(ids, chosen, top)
        return ServedStep(
            index=index,
            position=len(ids),
            chosen=ServedCandidate(chosen, self.piece(chosen), logprob),
            rank=rank,
            top=tuple(ServedCandidate(t, self.piece(t), lp) for t, lp in top),
            request_ms=request_ms,
            finish=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        )

    def rank_of(self, ids: list[int], token: int, top: list[tuple[int, float]]) -> int:
        """`token`'s rank after `ids`: from the top-N, else from the server's prompt_logprobs of `ids`
        and the token (one more request)."""
        rank = next((i for i, (t, _) in enumerate(top, 1) if t == token), None)
        if rank is not None:
            return rank
        choice = self._complete([*ids, token], {"temperature": 0}, 1, prompt_logprobs=0)
        try:
            entry = choice["prompt_logprobs"][-1]
            return checked_rank(entry[str(token)]["rank"], self.endpoint.host)
        except (KeyError, IndexError, TypeError, ValueError):
            raise EndpointError(f"{self.endpoint.host} did not give a token's rank (prompt_logprobs)") from None

    def score(self, text: str, top_n: int = 5) -> dict[str, Any]:
        """How likely the served model finds `text`: each token after the first with its log-probability
        and rank and the server's top candidates there (its prompt_logprobs, one request), the total and
        the perplexity. No entropy: the server returns a top-N, not the whole distribution."""
        ids = self.encode(text)
        if len(ids) < 2:
            raise TokenvizError("the text is a single token: there is nothing to score after the first")
        choice = self._complete(ids, {"temperature": 0}, 1, prompt_logprobs=top_n)
        entries = choice.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise EndpointError(f"{self.endpoint.host} did not give the text's prompt_logprobs")
        tokens: list[dict[str, Any]] = []
        total, host = 0.0, self.endpoint.host
        for index, (token, entry) in enumerate(zip(ids[1:], entries[1:]), 1):
            try:
                own = entry[str(token)]
                logprob, rank = checked_logprob(own["logprob"], host), checked_rank(own["rank"], host)
                ranked = [(int(k), v) for k, v in entry.items() if checked_rank(v["rank"], host) <= top_n]
                top = sorted(((t, checked_logprob(v["logprob"], host, True)) for t, v in ranked), key=lambda t: -t[1])
            except (KeyError, TypeError, ValueError, AttributeError):
                raise EndpointError(f"{self.endpoint.host} gave a prompt_logprobs entry tokenviz cannot read") from None
            tokens.append({
                "index": index, "id": token, "text": self.piece(token), "logprob": logprob,
                "prob": math.exp(logprob), "rank": rank,
                "top": [{"id": t, "text": self.piece(t), "prob": math.exp(lp)} for t, lp in top],
            })  # fmt: skip
            total += logprob
        return {
            "model": {"name": self.model, "served": True, "endpoint": self.endpoint.url},
            "first": {"id": ids[0], "text": self.piece(ids[0])},
            "tokens": tokens,
            "scored": len(tokens),
            "logprob": total,
            "perplexity": math.exp(-total / len(tokens)),
            "requests": self.endpoint.requests,
        }

    def run(self) -> None:
        while self.step() is not None:
            pass

    @property
    def text(self) -> str:
        return "".join(self.piece(t) for t in self.ids[len(self.prompt_ids) :])

    def document(self) -> dict[str, Any]:
        """The served journey as a trace document (no trace of the API key anywhere in it)."""
        return {
            "model": {"name": self.model, "served": True, "endpoint": self.endpoint.url},
            "distribution": {
                "top_n": self.top_n,
                "of": "the server's top-N log-probabilities",
                "kind": self.distribution,
            },
            "settings": self.settings.to_json(),
            "prompt": {"text": self.prompt, "ids": self.prompt_ids},
            "steps": [s.to_json() for s in self.steps],
            "requests": self.endpoint.requests,
            "stop_reason": self.stop_reason,
            "text": self.text,
        }


def token_id(name: Any) -> int:
    if not isinstance(name, str) or not name.startswith(ID_PREFIX) or not name[len(ID_PREFIX) :].isdigit():
        raise ValueError(f"not a token id: {name!r}")
    return int(name[len(ID_PREFIX) :])
