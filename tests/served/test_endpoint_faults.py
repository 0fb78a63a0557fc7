"""What a misbehaving server does to the client, each one line: a busy one (429/503) retried with the
wait said, an answer too large, not JSON or not finite refused in bounded memory, a redirect not
followed (it would carry the key). A real vLLM server does none of these on demand, so a small HTTP
server here plays each part."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from tokenviz.backends.shared import endpoint as endpoint_module
from tokenviz.backends.shared.endpoint import ApiKey, EndpointError, connect

KEY = "faults-test-key-123"


class Script:
    """The answers the server gives, in order: (status, headers, body)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.seen: list[str] = []  # the Authorization headers received


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            script.seen.append(self.headers.get("Authorization", ""))
            status, headers, body = script.answers.pop(0)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", script
    httpd.shutdown()


def models(name: str = "m") -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps({"data": [{"id": name}]}).encode()


def test_a_busy_server_is_retried_with_the_wait_said(server, monkeypatch):
    url, script = server
    monkeypatch.setenv("FAULTS_KEY", KEY)
    monkeypatch.setattr(endpoint_module, "RETRIES", (0.01, 0.01, 0.01, 0.01))
    said: list[str] = []
    endpoint = connect(url, ApiKey(env="FAULTS_KEY"), say=said.append)
    script.answers = [(503, {}, b""), (429, {}, b""), models()]
    assert endpoint.get("/models")["data"][0]["id"] == "m"
    assert len(said) == 2 and "busy (HTTP 503)" in said[0] and "busy (HTTP 429)" in said[1]
    assert all(KEY not in line for line in said) and script.seen == [f"Bearer {KEY}"] * 3
    script.answers = [(503, {}, b"")] * 5  # busy past every retry: one line
    with pytest.raises(EndpointError, match="HTTP 503"):
        endpoint.get("/models")


def test_a_bad_answer_is_refused_in_one_line(server, monkeypatch):
    url, script = server
    monkeypatch.setattr(endpoint_module, "MAX_RESPONSE_BYTES", 1000)
    endpoint = connect(url, ApiKey())
    for answer, words in (
        ((200, {}, b"x" * 5000), "more than"),
        ((200, {}, b"<html>not json"), "answer"),
        ((200, {}, b'{"logprob": NaN}'), "answer"),
        ((302, {"Location": "http://192.0.2.1/steal"}, b""), "HTTP 302"),
        ((401, {}, b'{"error": "Unauthorized"}'), r"refused the API key \(HTTP 401\)"),
    ):
        script.answers = [answer]
        with pytest.raises(EndpointError, match=words) as failure:
            endpoint.get("/models")
        assert "\n" not in str(failure.value)
