"""One completion request for one token, as a served model's every step asks it: the tokens sent as
ids, the sampling settings as the request's fields, the server's own top-N log-probabilities named by
token id, every number in the answer checked before it is used. Also which server and model the
options name (ServedChoice), and whether the server's log-probabilities are before its sampling
settings (measured: two requests that differ only in temperature).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenviz.backends.shared.endpoint import ApiKey, Endpoint, EndpointError, Say, connect
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import is_count, safe_text

TOP_N = 20  # the server's top log-probabilities asked for each step (vLLM allows up to --max-logprobs)
ID_PREFIX = "token_id:"  # how vLLM names a token with return_tokens_as_token_ids
RAW_TOLERANCE = 1e-4  # log-probabilities equal at two temperatures within this: the raw distribution

REPRODUCED_WITHIN = 1e-3  # nats: a served model's log-probabilities asked again (vLLM's float32 kernels: 4e-5)
LOGPROB_SLACK = 1e-3  # a log-probability above 0 by no more than this is float rounding: taken as 0
ANSWER_BYTES = 64 << 10  # an answer's JSON beside its entries and activations
ENTRY_BYTES = 512  # one log-probability entry as vLLM writes it (id, text, number, rank), generously
MOST_RANK = 10**8  # a rank past this is past any vocabulary: refused where the vocabulary is unknown


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
    shown = ", ".join(endpoint.masked(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if given is not None and given not in names:
        raise TokenvizError(f"{endpoint.host} does not serve {endpoint.masked(given)!r}; it serves {shown}")
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
    token id: the answer's choice."""
    return choice_of(answered(endpoint, model, ids, fields, logprobs, **extra), endpoint.host)


def answered(
    endpoint: Endpoint,
    model: str,
    ids: Sequence[int],
    fields: dict[str, Any],
    logprobs: int,
    activation_bytes: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """The whole answer to `complete`'s request (where the plugin's activations are, at most
    `activation_bytes` of them as sent: internals.capture_bytes), read no further than the request
    can need (answer_bound)."""
    body = {"model": model, "prompt": list(ids), "max_tokens": 1, "logprobs": logprobs}
    body |= {"return_tokens_as_token_ids": True, **fields, **extra}
    answer = endpoint.post("/completions", body, most=answer_bound(body, activation_bytes))
    if not isinstance(answer, dict):
        raise EndpointError(f"{endpoint.host} answered /v1/completions with no object")
    return answer


def answer_bound(body: dict[str, Any], activation_bytes: int = 0) -> int:
    """The most bytes an honest answer to `body` takes: its log-probability entries (the top N of each
    token, each prompt position's with prompt_logprobs) at a generous size each, the activations asked,
    and the rest of the JSON. A longer answer is refused unread (a top list of 10^6 entries was parsed
    and sorted whole: 15 s of CPU an answer)."""
    entries = int(body.get("max_tokens") or 1) * (int(body.get("logprobs") or 0) + 2)
    prompt = body.get("prompt_logprobs")
    if isinstance(prompt, int):
        entries += len(body.get("prompt") or ()) * (prompt + 2)
    return ANSWER_BYTES + entries * ENTRY_BYTES + activation_bytes


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


def token_id(name: Any) -> int:
    if not isinstance(name, str) or not name.startswith(ID_PREFIX) or not is_count(name[len(ID_PREFIX) :]):
        raise ValueError(f"not a token id: {name!r}")
    return int(name[len(ID_PREFIX) :])
