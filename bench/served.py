"""A served model's figures (--endpoint): a stepped journey against bare requests, the lens's cost."""

from __future__ import annotations

import statistics
import time

from bench.anchors import PROMPT
from tokenviz.backends.served.engine import ServedEngine
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

STREAM_LINES_A_TOKEN = 4  # lines of a streamed answer a token may take (vLLM's: its event and a blank line)


def served(url: str, api_key, insecure_http: bool = False, tokens: int = 32, rounds: int = 3) -> dict:
    """A served journey (trace --endpoint: a Session on the served engine, as the app steps it) against
    the same server: its time per token against the server's own streamed generation of the same tokens,
    and a step against a bare one-token request at the same context (rounds interleaved). The server's,
    network included: no model runs here. Every request goes through the app's own client (`connect`: the
    token's rules, no redirect, deadlines)."""
    engine = _engine(url, api_key, insecure_http)
    stepped, bare, streamed, first = [], [], [], []
    for _ in range(rounds):  # (the first round also asks the server for each new token's text, once)
        session = Session(engine, SamplingSettings(temperature=0, max_new_tokens=tokens))
        session.start(PROMPT)  # (its first draw: one request)
        t0 = time.perf_counter()
        while session.step() is not None:  # a request each, but the last (its token ends the journey)
            pass
        ids, prompt_len = list(session.ids), len(session.prompt_ids)
        n = len(ids) - prompt_len - 1  # (fewer than `tokens` where the model ends the text)
        stepped.append((time.perf_counter() - t0) / n)
        body = {"model": engine.model, "max_tokens": 1, "temperature": 0, "logprobs": engine.top_n}
        t0 = time.perf_counter()
        for end in range(prompt_len + 1, len(ids)):  # the same contexts, a bare request each
            engine.endpoint.post("/completions", {**body, "prompt": ids[:end], "return_tokens_as_token_ids": True})
        bare.append((time.perf_counter() - t0) / n)
        seconds, to_first, streamed_ids = _streamed(engine.endpoint, engine.model, ids[:prompt_len], n + 1)
        streamed.append(seconds / (n + 1))
        first.append(to_first)
    step_ms, bare_ms, stream_ms = (statistics.median(x) * 1e3 for x in (stepped, bare, streamed))
    return {
        "step_ms": step_ms,
        "bare_request_ms": bare_ms,
        "streamed_ms_per_token": stream_ms,
        "time_to_first_token_ms": statistics.median(first) * 1e3,
        "ratio": step_ms / bare_ms,
        "stepped_over_streamed": step_ms / stream_ms,
        "same_tokens": streamed_ids == ids[prompt_len:],
    }


def _engine(url: str, api_key, insecure_http: bool, model_files: str | None = None) -> ServedEngine:
    """The served engine as `--endpoint URL [--tokenizer DIR]` makes it."""
    from tokenviz.backends.served.completions import ServedChoice

    return ServedEngine.open(ServedChoice(url, None, api_key, insecure_http), model_files)


def served_lens(url: str, api_key, model_files: str, insecure_http: bool = False, tokens: int = 16) -> dict:
    """The app's path on a served model (Session on the served engine): a step with no internal view
    open against a bare one-token request at the same context, and a step with the lens open (the step
    and the lens's request at its position, as the app asks it) against the plain step. Needs the
    vllm-lens plugin on the server and the model's directory (its head)."""
    engine = _engine(url, api_key, insecure_http, model_files)  # (no request for a token's text)
    endpoint = engine.endpoint
    if engine.internals is None:
        return {"skipped": engine.info.internals}
    plain: list[float] = []
    with_lens: list[float] = []
    bare: list[float] = []
    body = {"model": engine.model, "max_tokens": 1, "temperature": 0, "logprobs": engine.top_n}
    for lens in (False, True, False, True):  # (interleaved: the server's load shared alike)
        session = Session(engine, SamplingSettings(temperature=0, max_new_tokens=10**6))
        session.start(PROMPT)
        for _ in range(tokens):
            t0 = time.perf_counter()
            session.step()
            if lens:
                session.analyses.inspect(len(session.ids) - 2)  # (the lens of the step just taken)
            (with_lens if lens else plain).append(time.perf_counter() - t0)
            if not lens:
                t0 = time.perf_counter()
                endpoint.post("/completions", {**body, "prompt": session.ids[:-1], "return_tokens_as_token_ids": True})
                bare.append(time.perf_counter() - t0)
    step_ms, lens_ms, bare_ms = (statistics.median(x) * 1e3 for x in (plain, with_lens, bare))
    return {
        "step_ms": step_ms,
        "bare_request_ms": bare_ms,
        "step_with_lens_ms": lens_ms,
        "step_over_bare": step_ms / bare_ms,
        "ratio": lens_ms / step_ms,
    }


def _streamed(endpoint, model: str, ids: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(seconds, seconds to the first token, the token ids) of the server's own streamed generation."""
    from tokenviz.backends.served.endpoint import EndpointError
    from tokenviz.system.reading import parse_json

    body = {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0, "stream": True}
    body |= {"logprobs": 0, "return_tokens_as_token_ids": True, "ignore_eos": True}
    got: list[int] = []
    to_first: float | None = None
    most_lines = STREAM_LINES_A_TOKEN * tokens + 16  # (an event and a blank line each, the last [DONE])
    t0 = time.perf_counter()
    for count, line in enumerate(endpoint.stream_lines("/completions", body), 1):
        if count > most_lines or len(got) > tokens:
            raise EndpointError(f"{endpoint.host} streamed more than the {tokens} tokens asked: refused")
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = parse_json(line[len(b"data: ") :], f"{endpoint.host}'s streamed answer", EndpointError, finite=True)
        try:
            names = chunk["choices"][0]["logprobs"]["tokens"]
            ids = [int(name.removeprefix("token_id:")) for name in names]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise EndpointError(f"{endpoint.host} streamed an event without token ids") from None
        to_first = to_first if to_first is not None or not ids else time.perf_counter() - t0
        got += ids
    return time.perf_counter() - t0, to_first or 0.0, got
