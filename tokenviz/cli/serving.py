"""`tokenviz serve`: the app in a browser through textual-serve, each tab its own process with its own
model, so the server admits at most `max_sessions` tabs at once (the next gets a page saying the
server is full, and no process), and ends itself and every tab's process promptly when told to."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web
from textual_serve.server import Server

from tokenviz.contract.errors import ModelLoadError
from tokenviz.system.paths import bundled_gguf

PROCESS_BYTES = 600 << 20  # a tab's process before its model: Python, torch, transformers, textual
FLOAT32_PER_QUANTIZED_BYTE = 8  # a GGUF's weights as float32: about 8 bytes for each byte of 4-bit ones
MEMORY_SHARE = 0.8  # of the memory available, the most the tabs may plan to take
FULL_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>tokenviz: the server is full</title></head>
<body style="font-family: sans-serif; margin: 3em"><h1>The server is full</h1>
<p>This tokenviz server runs at most {limit} sessions at once, each with its own model, and all are open.
Close another tab, or ask whoever runs the server to start it with a larger <code>--max-sessions</code>.</p>
</body></html>"""
FULL_CLOSE_CODE = 4008  # the websocket's close code for a full server (4000-4999: an application's own)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
FOREIGN = "tokenviz serve answers only pages of its own origin, at the names it listens on"


def _bare(host: str) -> str:
    """A host as the Host header's name part has it, without brackets or a trailing dot, lower case."""
    return host.strip("[]").rstrip(".").lower()


def own_names(bound: str) -> frozenset[str]:
    """The names a request may give in its Host header: the loopback names and the address `bound`;
    bound to every interface, this machine's own names too (an IP address is always its own name)."""
    names = {*LOOPBACK_NAMES, _bare(bound)}
    if bound in WILDCARDS:
        names |= {_bare(socket.gethostname()), _bare(socket.getfqdn())}
    return frozenset(names)


def is_own_host(netloc: str, names: frozenset[str], port: int, wildcard: bool) -> bool:
    """Whether `netloc` (a Host header, or an Origin's host and port) names this server: one of
    `names` (or, listening on every interface, any IP address) at `port`. A name that is not ours is
    a page's trick (DNS rebinding: evil.example resolving to 127.0.0.1)."""
    parts = urllib.parse.urlsplit("//" + netloc)
    try:
        given_port = parts.port or 80
    except ValueError:
        return False
    host = _bare(parts.hostname or "")
    if given_port != port or not host:
        return False
    if host in names:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return wildcard


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def weights_bytes(model: str | None, bundled_gguf: Path | None) -> int:
    """What one session's weights take in memory, from the files alone (0 where they cannot be found
    on this machine: a Hugging Face id not yet downloaded)."""
    path = Path(model).expanduser() if model is not None else bundled_gguf
    if path is None or not path.exists():
        return 0
    if path.is_file():
        size = path.stat().st_size
        return size * FLOAT32_PER_QUANTIZED_BYTE if path.suffix == ".gguf" else size
    files = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    ggufs = [p for p in path.iterdir() if p.suffix == ".gguf"]
    return sum(p.stat().st_size for p in files) or sum(p.stat().st_size * FLOAT32_PER_QUANTIZED_BYTE for p in ggufs)


def default_max_sessions(session_bytes: int, available: int | None = None) -> int:
    """How many sessions of `session_bytes` fit in the memory available now (at least one)."""
    available = psutil.virtual_memory().available if available is None else available
    return max(1, int(MEMORY_SHARE * available // max(session_bytes, 1)))


def session_limit(asked: int, model: str | None, weights_here: bool = True) -> tuple[int, str]:
    """(the most sessions at once, why): `asked`, or what the memory available holds (without
    `weights_here`, a served model's, a tab holds no weights: each is a client of its server)."""
    if asked:
        return asked, "--max-sessions"
    try:
        bundled = bundled_gguf() if model is None and weights_here else None
    except ModelLoadError:
        bundled = None  # each tab will say so itself
    each = PROCESS_BYTES + (weights_bytes(model, bundled) if weights_here else 0)
    available = psutil.virtual_memory().available
    return default_max_sessions(each, available), (
        f"about {each / 2**30:.1f} GB each, {available / 2**30:.1f} GB available; --max-sessions changes it"
    )


class LimitedServer(Server):
    """textual-serve's server, admitting at most `max_sessions` tabs at once."""

    def __init__(self, command: str, max_sessions: int, **kwargs: Any):
        super().__init__(command, **kwargs)
        self.max_sessions = max_sessions
        self.connected: list[web.Request] = []  # the tabs' websocket requests (requests do not hash)
        self.names = own_names(self.host)

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.own_origin_only)
        return app

    def is_own(self, netloc: str) -> bool:
        return is_own_host(netloc, self.names, self.port, self.host in WILDCARDS)

    @web.middleware
    async def own_origin_only(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """403 for a request to a name not ours, or from a page of another origin: a web page the user
        visits could otherwise open the websocket and drive the model (and the server's token) and
        read the screen. (A browser always says a websocket's Origin; a page's own loads say none.)"""
        origin = request.headers.get("Origin")
        parts = urllib.parse.urlsplit(origin or "")
        own_origin = origin is None or (parts.scheme in ("http", "https") and self.is_own(parts.netloc))
        if not self.is_own(request.host) or not own_origin:
            return web.Response(status=403, text=FOREIGN)
        return await handler(request)

    @property
    def sessions(self) -> int:
        """The tabs connected now: a tab closed frees its slot at once, while its process still ends."""
        return sum(1 for r in self.connected if r.transport is not None and not r.transport.is_closing())

    def full(self) -> web.Response:
        return web.Response(
            status=503, text=FULL_PAGE.format(limit=self.max_sessions), content_type="text/html", charset="utf-8"
        )

    async def handle_index(self, request: web.Request) -> Any:
        if self.sessions >= self.max_sessions:
            return self.full()
        return await super().handle_index(request)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        if self.sessions >= self.max_sessions:  # (a tab loaded while another was starting): no process
            websocket = web.WebSocketResponse()
            await websocket.prepare(request)
            await websocket.close(code=FULL_CLOSE_CODE, message=b"the server is full")
            return websocket
        self.connected.append(request)  # one event loop: no race between the check and the count
        try:
            return await super().handle_websocket(request)
        finally:
            self.connected.remove(request)

    async def on_shutdown(self, app: web.Application) -> None:
        """Drop every tab's connection, so no handler keeps the server waiting for its browser."""
        for request in list(self.connected):
            if request.transport is not None:
                request.transport.close()

    def request_exit(self) -> None:
        """SIGTERM or SIGINT: every tab's process is told to end at once (SIGTERM, then SIGKILL what is
        left after a second), then the server ends."""
        children = psutil.Process(os.getpid()).children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(children, timeout=1.0)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=0.3)  # reaps those that were this process's own
        super().request_exit()
