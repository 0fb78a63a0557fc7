"""A served model's figures (--endpoint): a stepped journey against bare requests, the lens's cost."""

from __future__ import annotations

import queue
import statistics
import time
from collections.abc import Callable

from bench.anchors import PROMPT, lens_view_rows
from tokenviz.backends.served.engine import ServedEngine
from tokenviz.contract.commands import Inspect, Step
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import Snapshot
from tokenviz.worker.engine_thread import EngineWorker

STREAM_LINES_A_TOKEN = 4  # lines of a streamed answer a token may take (vLLM's: its event and a blank line)
FRAME_WITHIN_S = 120  # the most a frame may take to come (a busy server retried)


class AppPath:
    """The engine thread on a served engine, driven as the app's keys drive it: a command submitted, timed
    to the first frame that shows its result (the snapshot built, the text decoded: all the app waits on)."""

    def __init__(self, engine: ServedEngine, settings: SamplingSettings):
        self.frames: queue.Queue[Snapshot] = queue.Queue()
        self.worker = EngineWorker(lambda progress: engine, settings, PROMPT)
        self.worker.start(self.frames.put)
        self.last = self._until(lambda s: s.state in ("ready", "stopped"))

    def _until(self, shows: Callable[[Snapshot], bool]) -> Snapshot:
        while True:
            s = self.frames.get(timeout=FRAME_WITHIN_S)
            if s.error or s.state == "error":  # (the journey's error, as the app shows it)
                self.stop()
                raise TokenvizError(s.error or s.message)
            if shows(s):
                self.last = s
                return s

    def step(self) -> float:
        """Seconds from Step to the frame with the next token decided (or the journey stopped)."""
        taken, t0 = len(self.last.records), time.perf_counter()
        self.worker.submit(Step())
        self._until(lambda s: len(s.records) > taken or s.stop_reason is not None)
        return time.perf_counter() - t0

    def lens(self, position: int, rows: tuple[int, ...] | None) -> float:
        """Seconds from the lens's request at `position` of `rows` (as the lens view asks it; None: every
        row, as trace --lens) to the frame with it."""
        t0 = time.perf_counter()
        self.worker.submit(Inspect(position, rows))
        self._until(lambda s: (found := s.result(Inspect)) is not None and found.position == position)
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.worker.stop()


def served(url: str, api_key, insecure_http: bool = False, tokens: int = 32, rounds: int = 3) -> dict:
    """A served journey (the app's path: the engine thread, each step a Step and the frame showing it)
    against the same server: its time per token against the server's own streamed generation of the same tokens,
    and a step against a bare one-token request at the same context (rounds interleaved). The server's,
    network included: no model runs here. Every request goes through the app's own client (`connect`: the
    token's rules, no redirect, deadlines)."""
    engine = _engine(url, api_key, insecure_http)
    stepped, bare, streamed, first = [], [], [], []
    for _ in range(rounds):  # (the first round also asks the server for each new token's text, once)
        app = AppPath(engine, SamplingSettings(temperature=0, max_new_tokens=tokens))  # (its first draw: a request)
        seconds = 0.0
        while app.last.stop_reason is None:  # a request each, but the last (its token ends the journey)
            seconds += app.step()
        app.stop()
        ids, prompt_len = [c.id for c in app.last.chips], app.last.prompt_len
        n = len(ids) - prompt_len - 1  # (fewer than `tokens` where the model ends the text)
        stepped.append(seconds / n)
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
    """The app's path on a served model (the engine thread, as the app's keys drive it): a step with no
    internal view open against a bare one-token request at the same context; a step with the lens view
    open at 80x24 (the step and the lens's request at its position for the rows that view shows) against
    the plain step; and the same with every row (trace --lens, a view tall enough for all). Needs the
    vllm-lens plugin on the server and the model's directory (its head)."""
    engine = _engine(url, api_key, insecure_http, model_files)  # (no request for a token's text)
    endpoint = engine.endpoint
    if engine.internals is None:
        return {"skipped": engine.info.internals}
    shown = lens_view_rows(engine.info.layers)
    runs: dict[str, list[float]] = {"plain": [], "shown": [], "every": []}
    bare: list[float] = []
    body = {"model": engine.model, "max_tokens": 1, "temperature": 0, "logprobs": engine.top_n}
    for kind in ("plain", "shown", "every") * 2:  # (interleaved: the server's load shared alike)
        app = AppPath(engine, SamplingSettings(temperature=0, max_new_tokens=10**6))
        for _ in range(tokens):
            took = app.step()
            ids = [c.id for c in app.last.chips]  # (the context, and the pending token after it)
            if kind != "plain":
                took += app.lens(len(ids) - 2, shown if kind == "shown" else None)  # (the step just taken)
            runs[kind].append(took)
            if kind == "plain":
                t0 = time.perf_counter()
                endpoint.post("/completions", {**body, "prompt": ids[:-1], "return_tokens_as_token_ids": True})
                bare.append(time.perf_counter() - t0)
        app.stop()
    step_ms, lens_ms, every_ms, bare_ms = (
        statistics.median(x) * 1e3 for x in (runs["plain"], runs["shown"], runs["every"], bare)
    )
    return {
        "step_ms": step_ms,
        "bare_request_ms": bare_ms,
        "lens_rows": len(shown),
        "step_with_lens_ms": lens_ms,
        "step_with_every_row_ms": every_ms,
        "step_over_bare": step_ms / bare_ms,
        "ratio": lens_ms / step_ms,
        "every_row_ratio": every_ms / step_ms,
    }


def _streamed(endpoint, model: str, ids: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(seconds, seconds to the first token, the token ids) of the server's own streamed generation."""
    from tokenviz.backends.shared.endpoint import EndpointError
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
