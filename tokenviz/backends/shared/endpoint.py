"""An OpenAI-compatible server (vLLM's, as the documents this project grew from deploy it) reached over
HTTP: its base URL, the model it serves, the bearer token it wants, and one request at a time.

The token is read from an environment variable or a file, never from the command line, and checked
once when read (one line of printable ASCII); it goes only in the Authorization header, never in a
message, a document or a file, and never over plain http to a host other than this machine unless the
user says so. Every request the project makes to a server goes through `Endpoint` (httpx underneath):
redirects are never followed (they would carry the token), no proxy or credentials come from the
environment, and each request has a deadline for the whole of it (connecting, the headers and the
body: a server that answers a byte at a time is cut off there) and a bound on what is read. Every fault
is one line, with the token masked wherever a server's words are shown.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenviz.contract.backend import Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.reading import parse_json, read_file, size_text

CONNECT_TIMEOUT_S = 5.0  # an unreachable server is told within this
METADATA_DEADLINE_S = 8.0  # a whole request for the server's models, version, tokens or texts
REQUEST_DEADLINE_S = 120.0  # a whole completion: a long prompt's log-probabilities on a busy CPU
MAX_RESPONSE_BYTES = 32 << 20  # a response whose size its request does not bound is read no further
MAX_LINE_BYTES = 1 << 20  # a streamed answer's line
MAX_KEY_BYTES = 4096
MAX_ERROR_BYTES = 64 << 10  # of an error's body, read for the server's message
RETRIES = (0.5, 1.0, 2.0, 4.0)  # seconds waited before each retry of a 429 or 503
BUSY = (429, 503)
# httpcore's words for a connection closed before any answer: a kept-alive one the server closed as it was
# reused (uvicorn, vLLM's server, closes one idle for 5 s) races the request sent on it
STALE = "Server disconnected without sending a response"
WAITING_SAID_S = 1.0  # a request that has not answered by then is said in the status line
WAITING_FRACTION = 0.5  # how far a loading line that waits on a request shows its bar (how far is not known)
LOOPBACK_NAMES = ("localhost",)
MASK = "<the API key>"

Say = Callable[[str], None]  # a line for the user while waiting (a retry)


class EndpointError(TokenvizError):
    """The server could not be reached or did not answer as an OpenAI-compatible one does."""


class NoAnswer(EndpointError):
    """The server did not answer at all: unreachable, gone, or past the deadline. Never taken for a
    server that lacks what was asked (which answers, with an HTTP error): nothing waits on it again."""


def checked_key(value: str, source: str) -> str:
    """The token, refused in one line naming `source` (never the value) unless it is one line of
    printable ASCII: CR or LF would add a header of their own, and anything else cannot be sent."""
    value = value.strip()
    if not value:
        raise TokenvizError(f"{source} is empty: it must hold the API key")
    if not all(" " <= ch <= "~" for ch in value):
        raise TokenvizError(
            f"{source} must hold the API key as one line of printable ASCII (it holds another character)"
        )
    return value


@dataclass(frozen=True)
class ApiKey:
    """Where the bearer token comes from: an environment variable or a file (never the command line)."""

    env: str | None = None
    file: str | None = None

    def exposed(self) -> str | None:
        """A warning where the key file can be read by others than its owner (as ssh gives), or None."""
        if not self.file:
            return None
        try:
            mode = os.stat(os.path.expanduser(self.file)).st_mode
        except OSError:
            return None  # read() says why it cannot be read
        if stat.S_ISREG(mode) and mode & (stat.S_IRWXG | stat.S_IRWXO):
            return f"the API key file {safe_text(self.file)} can be read by others: chmod 600 it"
        return None

    def read(self) -> str | None:
        """The token, checked to be one line of printable ASCII."""
        if self.env and self.file:
            raise TokenvizError("give the API key one way: --api-key-env or --api-key-file")
        if self.env:
            value = os.environ.get(self.env)
            if not value:
                raise TokenvizError(f"--api-key-env {safe_text(self.env)}: that environment variable is not set")
            return checked_key(value, f"--api-key-env {safe_text(self.env)}")
        if self.file:
            source = f"the API key file {safe_text(self.file)}"
            data = read_file(self.file, MAX_KEY_BYTES, source)
            try:
                value = data.decode("ascii")
            except UnicodeDecodeError:
                raise TokenvizError(f"{source} is not ASCII text") from None
            if len(value.strip().splitlines()) > 1:
                raise TokenvizError(f"{source} must hold one token on one line")
            return checked_key(value, source)
        return None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def base_url(url: str, insecure_http: bool, with_key: bool) -> str:
    """The endpoint's base URL (…/v1 stripped of a trailing slash); refused where a token would travel
    unencrypted to another machine, or where it is not an http(s) URL."""
    url = url.strip()
    if not url.isascii() or not url.isprintable() or " " in url:
        raise TokenvizError(f"--endpoint must be a URL without spaces or control characters; got {safe_text(url)!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (a port that is not a number is refused here)
    except ValueError as exc:
        raise TokenvizError(f"--endpoint {safe_text(url)!r} is not a URL: {safe_text(str(exc))}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TokenvizError(f"--endpoint must be an http:// or https:// URL, as http://127.0.0.1:8000/v1; got {url!r}")
    if parts.username or parts.password:
        raise TokenvizError("--endpoint must not hold a user or password: give the token with --api-key-env")
    if parts.scheme == "http" and with_key and not is_loopback(parts.hostname) and not insecure_http:
        raise TokenvizError(
            f"the API key would travel unencrypted to {parts.hostname}: use https, or --insecure-http to send it anyway"
        )
    path = parts.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Deadline:
    """A whole request's deadline: when it passes, the request's socket is shut down, which ends a
    read blocked on a server that sends a byte at a time (httpx's timeouts are per read); and
    `waiting()`, which says what is waited on, once the request has waited WAITING_SAID_S."""

    def __init__(self, seconds: float, waiting: Callable[[], None]) -> None:
        self.seconds = seconds
        self.ends = time.monotonic() + seconds
        self.passed = False
        self.socket: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._cut)
        self._said = threading.Timer(WAITING_SAID_S, waiting)
        self._timer.daemon = self._said.daemon = True

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace extension: the connection's socket, as it is made (or wrapped for TLS)."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            found = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(found, socket.socket):
                self.socket = found

    def _cut(self) -> None:
        self.passed = True
        if self.socket is not None:
            with contextlib.suppress(OSError):  # it may be closed already
                self.socket.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        if self.passed or time.monotonic() > self.ends:
            self.passed = True
            raise TimeoutError

    def __enter__(self) -> _Deadline:
        self._timer.start()
        self._said.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self._said.cancel()


@dataclass
class Endpoint:
    """One OpenAI-compatible server: `url` is its base (…/v1), `root` the server's own routes' base."""

    url: str
    key: str | None = None
    say: Say = lambda line: None
    waiting: Say = lambda line: None  # said from a timer's thread once a request has waited WAITING_SAID_S
    requests: int = field(default=0, init=False)
    answered: int = field(default=0, init=False)  # requests the server answered at all
    _client: httpx.Client | None = field(default=None, init=False, repr=False, compare=False)
    _phase: tuple[float, float, str] | None = field(default=None, init=False, repr=False, compare=False)

    def tell(self, progress: Progress) -> None:
        """Say what its requests wait on through `progress` (a backend loader's, kept for the engine's life:
        the one way an engine speaks): a busy server retried, a request past WAITING_SAID_S."""
        self.say = lambda line: progress(line, None)
        self.waiting = lambda line: progress(line, WAITING_FRACTION)

    @property
    def root(self) -> str:
        """Where vLLM's own routes live (/tokenize, /detokenize, /version): the base without /v1."""
        return self.url.removesuffix("/v1")

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).netloc

    def headers(self) -> dict[str, str]:
        """A JSON request's headers, the bearer token among them (the only place it is sent)."""
        return {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Accept-Encoding": "identity",  # (a compressed answer is not inflated here: refused as not JSON)
            **({"Authorization": f"Bearer {self.key}"} if self.key else {}),
        }

    def masked(self, text: str) -> str:
        """`text` fit for a line: the token masked (a server may echo it), control characters shown."""
        return safe_text(text.replace(self.key, MASK) if self.key else text)

    def client(self) -> httpx.Client:
        """One connection, kept alive between requests; nothing taken from the environment (a proxy
        there would see the token), no redirect followed."""
        if self._client is None:
            self._client = httpx.Client(
                follow_redirects=False,
                trust_env=False,
                timeout=httpx.Timeout(REQUEST_DEADLINE_S, connect=CONNECT_TIMEOUT_S),
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            )
        return self._client

    def get(self, path: str, root: bool = False, deadline: float = METADATA_DEADLINE_S) -> Any:
        return self._send("GET", path, None, root, deadline, MAX_RESPONSE_BYTES)

    def post(
        self,
        path: str,
        body: dict[str, Any],
        root: bool = False,
        deadline: float | None = None,
        most: int | None = None,
    ) -> Any:
        """A POST: a completion's deadline unless `deadline` says otherwise (the server's own routes,
        /tokenize and /detokenize, are metadata); its answer read no further than `most` bytes (what
        the request can need: completions.answer_bound; else MAX_RESPONSE_BYTES)."""
        seconds = deadline if deadline is not None else METADATA_DEADLINE_S if root else REQUEST_DEADLINE_S
        return self._send("POST", path, body, root, seconds, most if most is not None else MAX_RESPONSE_BYTES)

    def stream_lines(self, path: str, body: dict[str, Any], deadline: float = REQUEST_DEADLINE_S) -> Iterator[bytes]:
        """The lines of a streamed answer (server-sent events), each at most MAX_LINE_BYTES, the
        whole within `deadline` seconds."""
        with _Deadline(self._within(deadline, path), self._waiting_on(path, deadline)) as clock:
            try:
                with self.client().stream(
                    "POST", self.url + path, json=body, headers=self.headers(), extensions={"trace": clock.trace}
                ) as response:
                    self.requests += 1
                    self.answered += 1
                    if response.status_code != 200:
                        raise EndpointError(self._refusal(response, path, clock))
                    pending = b""
                    for chunk in response.iter_raw():
                        clock.check()
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        if len(pending) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
                            raise EndpointError(f"{self.host} streamed a line longer than {MAX_LINE_BYTES >> 20} MB")
                        yield from lines
                    if pending:
                        yield pending
            except (httpx.HTTPError, TimeoutError, OSError) as exc:
                raise NoAnswer(self._failure(exc, path, clock)) from None

    def _send(self, method: str, path: str, body: dict[str, Any] | None, root: bool, deadline: float, most: int) -> Any:
        url = (self.root if root else self.url) + path
        for attempt, wait in enumerate((*RETRIES, None)):
            status, data = self._answer(method, url, body, path, deadline, most)
            if status in BUSY and wait is not None:
                self.say(f"{self.host} is busy (HTTP {status}): trying again in {wait:g} s ({attempt + 1})")
                time.sleep(wait)
                continue
            if status != 200:
                raise EndpointError(data)
            return parse_json(data, f"{self.host}'s answer", EndpointError, finite=True)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _answer(
        self, method: str, url: str, body: dict[str, Any] | None, path: str, deadline: float, most: int
    ) -> tuple[int, Any]:
        """One request (see _once), sent again once on a new connection where the server closed the one it
        went on without a word (STALE: a kept-alive connection it closed as it was reused; it never read
        the request)."""
        for again in (False, True):
            with _Deadline(self._within(deadline, path), self._waiting_on(path, deadline)) as clock:
                try:
                    return self._once(method, url, body, path, clock, most)
                except httpx.RemoteProtocolError as exc:
                    if again or STALE not in str(exc):
                        raise NoAnswer(self._failure(exc, path, clock)) from None
                except (httpx.HTTPError, TimeoutError, OSError) as exc:
                    raise NoAnswer(self._failure(exc, path, clock)) from None
        raise AssertionError("unreachable")  # the second try returns or raises

    @contextlib.contextmanager
    def phase(self, seconds: float, what: str) -> Iterator[None]:
        """One deadline over every request made within: `what` (as "connecting") takes at most `seconds`
        in all, however many requests it makes, each cut to what is left of it."""
        self._phase = (time.monotonic() + seconds, seconds, what)
        try:
            yield
        finally:
            self._phase = None

    def _waiting_on(self, path: str, deadline: float) -> Callable[[], None]:
        """What says, from a timer's thread, that `path` has not answered yet."""
        started = time.monotonic()

        def said() -> None:
            within = self._phase[2] if self._phase is not None else f"a deadline of {deadline:g} s"
            self.waiting(
                f"waiting on {self.host}: {path} has not answered for {time.monotonic() - started:.0f} s ({within})"
            )

        return said

    def _within(self, deadline: float, path: str) -> float:
        """A request's deadline, cut to what is left of the phase it is part of (none left: NoAnswer)."""
        if self._phase is None:
            return deadline
        ends, seconds, what = self._phase
        left = ends - time.monotonic()
        if left <= 0:
            raise NoAnswer(f"{self.host} took over {seconds:g} s {what} (the last route it was asked: {path})")
        return min(deadline, left)

    def _once(
        self, method: str, url: str, body: dict[str, Any] | None, path: str, clock: _Deadline, most: int
    ) -> tuple[int, Any]:
        """(200, the body's bytes, at most `most`) or (another status, the line saying it)."""
        self.requests += 1
        with self.client().stream(
            method, url, json=body, headers=self.headers(), extensions={"trace": clock.trace}
        ) as response:
            self.answered += 1
            if response.status_code != 200:
                return response.status_code, self._refusal(response, path, clock)
            data = _read(response, clock, most)
            if len(data) > most:
                raise EndpointError(
                    f"{self.host} answered {path} with more than the {size_text(most)} the request can need: refused"
                )
            return 200, data

    def _failure(self, exc: BaseException, path: str, clock: _Deadline) -> str:
        """One line for a request that did not complete: the deadline, or why it could not."""
        timed_out = isinstance(exc, TimeoutError | httpx.ReadTimeout | httpx.WriteTimeout | httpx.PoolTimeout)
        if clock.passed or timed_out:
            within = f" ({self._phase[2]}: {self._phase[1]:g} s in all)" if self._phase is not None else ""
            return f"{self.host} did not answer {path} within {clock.seconds:.3g} s{within}"
        said = self.masked(shortened(str(exc) or type(exc).__name__, 200))
        if self.answered:  # it had answered before: it went away, or hung up mid-answer
            return f"the server at {self.host} stopped answering ({said})"
        return f"cannot reach the server at {self.host}: {said}"

    def _refusal(self, response: httpx.Response, path: str, clock: _Deadline) -> str:
        """One line for an HTTP error: the token is never part of it (the server's own words may be,
        masked)."""
        code = response.status_code
        if code in (401, 403):
            return f"{self.host} refused the API key (HTTP {code}): check --api-key-env or --api-key-file"
        if 300 <= code < 400:
            return f"{self.host} answered {path} with HTTP {code} (a redirect, not followed: it would carry the key)"
        try:
            detail = json.loads(_read(response, clock, MAX_ERROR_BYTES)[:MAX_ERROR_BYTES] or b"{}")
            message = detail.get("error", {}).get("message") if isinstance(detail.get("error"), dict) else None
            message = message or detail.get("message") or detail.get("detail") or ""
        except (ValueError, AttributeError):
            message = ""
        said = f": {self.masked(shortened(str(message), 200))}" if message else ""
        return f"{self.host} answered {path} with HTTP {code}{said}"


def _read(response: httpx.Response, clock: _Deadline, most: int) -> bytes:
    """The body as it came (never inflated), read no further than one byte past `most`, within the
    request's deadline."""
    data = bytearray()
    for chunk in response.iter_raw():
        clock.check()
        data += chunk
        if len(data) > most:
            break
    return bytes(data)


def connect(url: str, api_key: ApiKey, insecure_http: bool = False, say: Say = lambda line: None) -> Endpoint:
    """The endpoint at `url` with its token, checked to answer (within CONNECT_TIMEOUT_S) before
    anything else waits on it."""
    key = api_key.read()
    endpoint = Endpoint(base_url(url, insecure_http, key is not None), key, say)
    parts = urllib.parse.urlsplit(endpoint.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        said = exc.strerror or type(exc).__name__
        raise NoAnswer(f"cannot reach the server at {endpoint.host}: {safe_text(said)}") from None
    return endpoint
