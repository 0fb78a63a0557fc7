"""An OpenAI-compatible server (vLLM's, as the documents this project grew from deploy it) reached over
HTTP: its base URL, the model it serves, the bearer token it wants, and one request at a time.

The token is read from an environment variable or a file, never from the command line; it goes only
in the Authorization header, never in a message, a document or a file, and never over plain http to
a host other than this machine unless the user says so. Every fault is one line: an unreachable
server (within seconds), a refused token (not echoed), an unknown model (the served ones listed),
a busy server (429/503, retried with backoff and said), a response too large, malformed or not finite.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.reading import parse_json, read_file
from tokenviz.contract.text import safe_text, shortened

CONNECT_TIMEOUT_S = 5.0  # an unreachable server is told within this
REQUEST_TIMEOUT_S = 120.0  # a request the server has taken (a long prompt on a busy CPU)
MAX_RESPONSE_BYTES = 32 << 20  # a response is read no further: a larger one is refused
MAX_KEY_BYTES = 4096
RETRIES = (0.5, 1.0, 2.0, 4.0)  # seconds waited before each retry of a 429 or 503
BUSY = (429, 503)
LOOPBACK_NAMES = ("localhost",)

Say = Callable[[str], None]  # a line for the user while waiting (a retry)


class EndpointError(TokenvizError):
    """The server could not be reached or did not answer as an OpenAI-compatible one does."""


@dataclass(frozen=True)
class ApiKey:
    """Where the bearer token comes from: an environment variable or a file (never the command line)."""

    env: str | None = None
    file: str | None = None

    def read(self) -> str | None:
        if self.env and self.file:
            raise TokenvizError("give the API key one way: --api-key-env or --api-key-file")
        if self.env:
            value = os.environ.get(self.env)
            if not value:
                raise TokenvizError(f"--api-key-env {safe_text(self.env)}: that environment variable is not set")
            return value.strip()
        if self.file:
            data = read_file(self.file, MAX_KEY_BYTES, f"the API key file {safe_text(self.file)}")
            try:
                value = data.decode("ascii").strip()
            except UnicodeDecodeError:
                raise TokenvizError(f"the API key file {safe_text(self.file)} is not ASCII text") from None
            if not value or any(c.isspace() for c in value):
                raise TokenvizError(f"the API key file {safe_text(self.file)} must hold one token on one line")
            return value
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
    parts = urllib.parse.urlsplit(url.strip())
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused, not followed: urllib would carry the Authorization header to wherever it
    points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


def _opener(host: str) -> urllib.request.OpenerDirector:
    """No redirects followed; no proxy for this machine's own server (a proxy in the environment would
    otherwise see the token)."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if is_loopback(host):
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


@dataclass
class Endpoint:
    """One OpenAI-compatible server: `url` is its base (…/v1), `root` the server's own routes' base."""

    url: str
    key: str | None = None
    say: Say = lambda line: None
    requests: int = field(default=0, init=False)

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
            **({"Authorization": f"Bearer {self.key}"} if self.key else {}),
        }

    def get(self, path: str, root: bool = False) -> Any:
        return self._send("GET", path, None, root)

    def post(self, path: str, body: dict[str, Any], root: bool = False) -> Any:
        return self._send("POST", path, body, root)

    def _send(self, method: str, path: str, body: dict[str, Any] | None, root: bool) -> Any:
        url = (self.root if root else self.url) + path
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers()
        for attempt, wait in enumerate((*RETRIES, None)):
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                self.requests += 1
                hostname = urllib.parse.urlsplit(url).hostname or ""
                with _opener(hostname).open(request, timeout=REQUEST_TIMEOUT_S) as response:
                    return _parsed(response.read(MAX_RESPONSE_BYTES + 1), self.host)
            except urllib.error.HTTPError as exc:
                if exc.code in BUSY and wait is not None:
                    self.say(f"{self.host} is busy (HTTP {exc.code}): trying again in {wait:g} s ({attempt + 1})")
                    time.sleep(wait)
                    continue
                raise EndpointError(_refusal(exc, self.host, path)) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                said = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
                raise EndpointError(f"cannot reach the server at {self.host}: {safe_text(said)}") from None
        raise AssertionError("unreachable")  # (the last attempt returns or raises)


def _parsed(data: bytes, host: str) -> Any:
    if len(data) > MAX_RESPONSE_BYTES:
        raise EndpointError(f"{host} answered with more than {MAX_RESPONSE_BYTES >> 20} MB: refused")
    return parse_json(data, f"{host}'s answer", EndpointError, finite=True)


def _refusal(exc: urllib.error.HTTPError, host: str, path: str) -> str:
    """One line for an HTTP error: the token is never part of it (the server's own words may be)."""
    if exc.code in (401, 403):
        return f"{host} refused the API key (HTTP {exc.code}): check --api-key-env or --api-key-file"
    try:
        detail = json.loads(exc.read(64 << 10) or b"{}")
        message = detail.get("error", {}).get("message") if isinstance(detail.get("error"), dict) else None
        message = message or detail.get("message") or detail.get("detail") or ""
    except (ValueError, AttributeError):
        message = ""
    said = f": {safe_text(shortened(str(message), 200))}" if message else ""
    return f"{host} answered {path} with HTTP {exc.code}{said}"


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
        raise EndpointError(f"cannot reach the server at {endpoint.host}: {safe_text(said)}") from None
    return endpoint
