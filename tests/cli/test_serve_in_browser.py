"""tokenviz serve in a real headless browser, on the bundled model: the page loads, the first frame
shows the prompt's token ids, a key press steps a token, closing a tab mid-step ends its process,
and the server goes on (a new tab gets a journey of its own)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from browser import SCREENSHOTS, SEEN, chromium, frames, free_port, needs_browser, press, until
from selenium.webdriver.common.by import By

pytestmark = pytest.mark.bundled

PROMPT = "The Eiffel Tower is located in"


def start_server(*options: str) -> tuple[subprocess.Popen, str]:
    """`tokenviz serve PROMPT --port P OPTIONS...` started and listening: (its process, its address)."""
    port = free_port()
    command = [sys.executable, "-m", "tokenviz", "serve", PROMPT, "--port", str(port), *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    until(lambda: process.poll() is not None or socket.socket().connect_ex(("127.0.0.1", port)) == 0, 30, 0.2)
    assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture
def server():
    process, url = start_server("--temperature", "0")
    yield process, url
    process.terminate()
    process.wait(10)


def open_app(browser, url: str) -> str:
    """Load the page, then wait for the app's first frame with the prompt's first token and its id."""
    SEEN.clear()
    browser.get(url)
    # (generous: each tab starts a tokenviz of its own, which a loaded machine starts slowly; seen over 60 s)
    return until(lambda: "The 504" in frames(browser), 240, 0.2)  # the prompt's first token and its id


@needs_browser
def test_served_app_shows_the_prompt_steps_on_a_key_and_survives_a_closed_tab(server):
    process, url = server

    def command_line(child: psutil.Process) -> list[str]:
        try:
            return child.cmdline()
        except psutil.NoSuchProcess:  # ended (or a zombie) while we looked: no longer a tab's app
            return []

    def apps() -> int:  # the app processes the server runs, one a tab
        children = psutil.Process(process.pid).children(recursive=True)
        lines = [command_line(c) for c in children]
        return sum(1 for line in lines if line[1:3] == ["-m", "tokenviz"] and "serve" not in line)

    with chromium(1400, 900) as browser:
        open_app(browser, url)
        press(browser, " ")
        until(lambda: "ready · step 1" in frames(browser), 60, 0.2)
        if SCREENSHOTS:
            time.sleep(1)
            browser.save_screenshot(str(Path(SCREENSHOTS) / "served-app.png"))
        first = browser.current_window_handle
        browser.switch_to.new_window("tab")
        open_app(browser, url)
        press(browser, "a")  # autoplay: mid-step from here on
        time.sleep(0.5)
        until(lambda: apps() == 2, 120, 0.2)  # (the performance log holds every tab's frames: wait for its process)
        browser.close()  # the tab goes, its journey mid-step: its process ends
        until(lambda: apps() == 1, 120, 0.2)
        browser.switch_to.window(first)
        browser.switch_to.new_window("tab")
        open_app(browser, url)  # the server still serves: a new tab gets a journey of its own
        until(lambda: apps() == 2, 120, 0.2)
        assert process.poll() is None


def test_serve_refuses_a_port_in_use_in_one_line_and_passes_the_rest_to_the_app(monkeypatch, capsys):
    from clitools import invoke

    from tokenviz.cli.commands.serve import app_arguments

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, _, err = invoke(monkeypatch, capsys, "serve", "--port", str(taken.getsockname()[1]))
    assert code == 2 and "cannot listen on 127.0.0.1" in err and "Traceback" not in err
    code, _, err = invoke(monkeypatch, capsys, "serve", "--port", "0")
    assert code == 2 and "--port must be" in err
    args = ["Hello", "--host", "0.0.0.0", "--port=9000", "--temperature", "0", "--port", "8001", "--chat"]
    assert app_arguments(args) == ["Hello", "--temperature", "0", "--chat"]


@pytest.fixture
def one_session_server():
    process, url = start_server("--max-sessions", "1")
    yield process, url
    process.kill()
    process.wait(10)


def app_processes(server: subprocess.Popen) -> int:
    """The app processes a server runs, one a tab (a child that ends while we look does not count)."""
    count = 0
    for child in psutil.Process(server.pid).children(recursive=True):
        try:
            line = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        count += line[1:3] == ["-m", "tokenviz"] and "serve" not in line
    return count


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running: ended ones, and zombies (ended, not yet reaped: they hold nothing), not."""
    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@needs_browser
def test_max_sessions_refuses_the_next_tab_with_a_page_frees_a_closed_tabs_slot_and_sigterm_ends_all(
    one_session_server,
):
    process, url = one_session_server
    with chromium(1200, 800) as browser:
        open_app(browser, url)
        until(lambda: app_processes(process) == 1, 120, 0.2)
        first = browser.current_window_handle
        browser.switch_to.new_window("tab")
        browser.get(url)  # the second tab: the server is full
        assert "The server is full" in browser.find_element(By.TAG_NAME, "h1").text
        assert "--max-sessions" in browser.find_element(By.TAG_NAME, "body").text
        time.sleep(1)
        assert app_processes(process) == 1  # and no process was started for it
        full = browser.current_window_handle
        browser.switch_to.window(first)
        browser.close()  # the first tab goes: its slot is free at once
        until(lambda: app_processes(process) == 0, 120, 0.2)
        browser.switch_to.window(full)
        browser.switch_to.new_window("tab")
        open_app(browser, url)  # the next tab is served now
        until(lambda: app_processes(process) == 1, 120, 0.2)
        children = psutil.Process(process.pid).children(recursive=True)
        started = time.monotonic()
        process.terminate()  # SIGTERM: the server and its tabs' processes end within 2 s
        process.wait(10)
        deadline = started + 2.0
        while running(children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(children) == []
    output = process.stdout.read().decode()
    assert "at most 1 session at once" in output


def test_the_default_session_limit_follows_memory_and_the_models_size(tmp_path):
    from tokenviz.cli.serving import PROCESS_BYTES, default_max_sessions, weights_bytes

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    assert weights_bytes(str(model), None) == 1000
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\0" * 100)
    assert weights_bytes(None, gguf) == 800  # a quantized file dequantizes to about 8 bytes for each
    assert weights_bytes("some/hub-id", None) == 0  # not on this machine: the process alone is counted
    assert default_max_sessions(PROCESS_BYTES + 1000, available=10 * (PROCESS_BYTES + 1000)) == 8
    assert default_max_sessions(10**12, available=10**9) == 1  # always at least one


def status_of(url: str, headers: dict[str, str], path: str = "/") -> int:
    """The status `tokenviz serve` at `url` answers a GET of `path` with `headers` (Host set by hand)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host="Host" in headers)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def test_serve_answers_only_its_own_names_and_origin(server):
    """A page on another origin, or a name that is not the server's (DNS rebinding: evil.example
    resolving to 127.0.0.1), gets 403 for the page and the websocket; its own names and origin get in."""
    process, url = server
    port = url.rsplit(":", 1)[1]
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert status_of(url, {"Host": host}) == 200, host
        assert status_of(url, {"Host": host, "Origin": f"http://{host}"}) == 200, host
    for host in (
        f"evil.example:{port}",
        f"127.0.0.1:{int(port) + 1}",
        "evil.example",
        f"127.0.0.1.evil.example:{port}",
    ):
        assert status_of(url, {"Host": host}) == 403, host
        assert status_of(url, {"Host": host, **upgrade}, "/ws") == 403, host
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"http://127.0.0.1:{int(port) + 1}"):
        assert status_of(url, {"Host": f"127.0.0.1:{port}", "Origin": origin}) == 403, origin
        assert status_of(url, {"Host": f"127.0.0.1:{port}", "Origin": origin, **upgrade}, "/ws") == 403, origin
    assert app_processes(process) == 0  # no tab's process was started for any of them


@needs_browser
def test_a_page_on_another_origin_cannot_open_serves_websocket(server):
    """A real browser on a page of another origin (another port of this machine) opens a websocket to
    `tokenviz serve`: refused, and no app process starts; the server's own page still gets in."""
    import http.server
    import threading

    process, url = server
    ws = url.replace("http://", "ws://") + "/ws"
    page = f"""<!doctype html><title>waiting</title><script>
      const socket = new WebSocket({json.dumps(ws)});
      socket.onopen = () => {{ document.title = "opened"; }};
      socket.onclose = () => {{ if (document.title !== "opened") document.title = "refused"; }};
    </script>""".encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with chromium(800, 600) as browser:
            browser.get(f"http://127.0.0.1:{other.server_address[1]}/")
            assert until(lambda: browser.title in ("opened", "refused") and browser.title, 20, 0.1) == "refused"
            time.sleep(1)
            assert app_processes(process) == 0
            open_app(browser, url)  # its own page, in the same browser
            until(lambda: app_processes(process) == 1, 120, 0.2)
    finally:
        other.shutdown()
