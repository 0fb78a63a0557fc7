"""A hostile OpenAI-compatible server, for the tests of what a client does with one: it answers as a
tiny vLLM would (a vocabulary of VOCAB tokens, each token's text "t<id>", a fixed distribution) unless a
test scripts a route otherwise, and it logs every request's path and Authorization header.

A real vLLM server is what the served tests use; this one plays only the broken or lying parts a real
server does not do on demand.
"""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

VOCAB = 100
MODEL = "hostile"
TOP = [(i, math.log(p)) for i, p in enumerate([0.4, 0.2, 0.1, 0.05] + [0.25 / 46] * 46)]  # (id, logprob)

Route = Callable[["Handler"], None]  # writes the whole answer itself


@dataclass
class Log:
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Authorization)

    def paths(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm the body waited for the client's
    # delayed ACK, 40 ms a request (as a real server, uvicorn's, sets TCP_NODELAY).
    disable_nagle_algorithm = True
    server: HostileHTTPServer

    def log_message(self, *args: object) -> None:
        pass

    def body(self) -> dict[str, Any]:
        return json.loads(self.raw_body or b"{}")

    def answer(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        self.send_response(status)
        for name, text in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, text)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self) -> None:
        path = self.path.split("?")[0]
        self.server.log.requests.append((path, self.headers.get("Authorization", "")))
        self.raw_body = self.rfile.read(
            int(self.headers.get("Content-Length") or 0)
        )  # (all of it: a next request follows)
        route = self.server.routes.get(path) or DEFAULTS.get(path)
        if route is None:
            self.answer(404, {"error": {"message": "not found"}})
        else:
            route(self)

    do_GET = do_POST = handle_any


def completion(top: list[tuple[int, float]] | None = None, chosen: int = 0, chosen_logprob: Any = None) -> Route:
    """A /v1/completions route answering one token with `top` as its top log-probabilities."""
    entries = TOP if top is None else top
    logprob = dict(entries).get(chosen, -5.0) if chosen_logprob is None else chosen_logprob
    written = "__RAW__" if isinstance(logprob, bytes) else logprob

    def route(h: Handler) -> None:
        asked = h.body()
        top_n = asked.get("logprobs") or 0
        shown = entries if top is not None else entries[:top_n]
        choice = {
            "text": f"token_id:{chosen}",
            "finish_reason": "length",
            "logprobs": {
                "tokens": [f"token_id:{chosen}"],
                "token_logprobs": [written],
                "top_logprobs": [{f"token_id:{i}": lp for i, lp in shown}],
            },
        }
        if asked.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": dict(entries).get(t, -5.0), "rank": 1 + t} for t in (token,)}
                for token in asked["prompt"][1:]
            ]
        text = json.dumps({"choices": [choice]})
        if isinstance(logprob, bytes):  # a number JSON can write and Python's float cannot hold, as 1e400
            text = text.replace('"__RAW__"', logprob.decode())
        h.answer(200, text.encode())

    return route


def _tokenize(h: Handler) -> None:
    text = h.body().get("prompt", "")
    h.answer(200, {"tokens": [ord(c) % VOCAB for c in text]})


def _detokenize(h: Handler) -> None:
    h.answer(200, {"prompt": "".join(f"t{t}" for t in h.body().get("tokens", []))})


DEFAULTS: dict[str, Route] = {
    "/v1/models": lambda h: h.answer(200, {"data": [{"id": MODEL}]}),
    "/tokenize": _tokenize,
    "/detokenize": _detokenize,
    "/v1/completions": completion(),
}


def slow(headers_first: bool, every: float, status_line: bytes = b"HTTP/1.1 200 OK\r\n") -> Route:
    """A slow loris: a byte every `every` seconds, in the headers (`headers_first`) or in the body, for
    as long as the client reads."""

    def route(h: Handler) -> None:
        try:
            if headers_first:
                for byte in status_line + b"X-Slow: " + b"a" * 10_000:
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
                    time.sleep(every)
            else:
                h.wfile.write(status_line + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                for _ in range(100_000):
                    h.wfile.write(b" ")
                    h.wfile.flush()
                    time.sleep(every)
        except OSError:
            pass  # (the client hung up: what it should do)

    return route


def silent(h: Handler) -> None:
    """Takes the request and never answers."""
    time.sleep(60)


class HostileHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    log: Log
    routes: dict[str, Route]


@contextmanager
def hostile_server() -> Iterator[HostileHTTPServer]:
    """The server on 127.0.0.1, its base URL at .url (…/v1)."""
    httpd = HostileHTTPServer(("127.0.0.1", 0), Handler)
    httpd.log, httpd.routes = Log(), {}
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def hang_up(h: Handler) -> None:
    """Closes the connection without a word: a server killed mid-request."""
    import socket

    h.close_connection = True
    h.connection.shutdown(socket.SHUT_RDWR)


def proxy(url: str, key: str, tamper: Callable[[dict[str, Any]], None] = lambda answer: None) -> Route:
    """A route that asks the real server at `url` (…/v1) with its key and answers what it answered, a
    completion's JSON first passed through `tamper` (a real server's internals, made to lie)."""
    import httpx

    root = url.removesuffix("/v1")

    def route(h: Handler) -> None:
        path = h.path.split("?")[0]
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        got = httpx.request(h.command, root + path, content=h.raw_body or None, headers=headers, timeout=120)
        if path == "/v1/completions" and got.status_code == 200:
            answer = got.json()
            tamper(answer)
            h.answer(200, answer)
        else:
            h.answer(got.status_code, got.content)

    return route


def proxying(server: HostileHTTPServer, url: str, key: str, tamper: Callable[[dict[str, Any]], None]) -> None:
    """Every path `server` knows answered by the real server at `url`, its completions tampered with."""
    for path in (*DEFAULTS, "/version"):
        server.routes[path] = proxy(url, key, tamper)
