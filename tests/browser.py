"""A real headless browser for the tests: Chromium from the system's packages, driven by Selenium.

Where there is none the tests that need it skip, saying how to install one (.ci/run installs it).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import time
from contextlib import contextmanager

import pytest

SCREENSHOTS = os.environ.get("TOKENVIZ_SCREENSHOTS")  # a folder: the browser tests save the README's pictures


def _found() -> tuple[str | None, str | None]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    return browser, shutil.which("chromedriver")


def _paths() -> tuple[str, str] | None:
    browser, driver = _found()
    return (browser, driver) if browser and driver else None


def missing() -> str:
    """What is missing for the browser tests, and how to install it (.ci/run installs both)."""
    browser, driver = _found()
    if browser and not driver:
        return f"Chromium is here ({browser}) but not its driver: apt-get install chromium-driver"
    if driver and not browser:
        return f"Chromium's driver is here ({driver}) but not Chromium: apt-get install chromium"
    return "no Chromium here: apt-get install chromium chromium-driver (the CI script does)"


INSTALL = missing()
needs_browser = pytest.mark.skipif(_paths() is None, reason=INSTALL)


@contextmanager
def chromium(width: int = 1280, height: int = 900):
    """A headless Chromium that reaches no network: every host but this machine resolves to nothing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = _paths()
    assert paths is not None, INSTALL
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # this machine only
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})  # console, websockets
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(predicate, timeout: float = 10.0, every: float = 0.05):
    """Poll `predicate` until it returns something true (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("not in time")


def chips_of(browser, count: int, timeout: float = 60.0):
    """The page's token chips once all `count` are drawn; failing, the page's console errors say why
    (a busy machine can hand the page over before its script has drawn them)."""
    from selenium.webdriver.common.by import By

    try:
        return until(
            lambda: (found := browser.find_elements(By.CSS_SELECTOR, ".chip")) and len(found) >= count and found,
            timeout,
        )
    except AssertionError:
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        shown = len(browser.find_elements(By.CSS_SELECTOR, ".chip"))
        raise AssertionError(f"{shown} of {count} chips drawn in {timeout:.0f} s; console errors: {errors}") from None


SEEN: list[str] = []  # what the page's websockets received, as text (see frames)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def frames(browser) -> str:
    """Everything the page's websockets received so far, as text: the app's terminal output with its
    escape sequences taken out. (Selenium hands each log entry over once, so this keeps them all.)"""
    out = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.webSocketFrameReceived":
            response = message["params"]["response"]
            data = response["payloadData"]
            out.append(base64.b64decode(data).decode("utf-8", "replace") if response["opcode"] == 2 else data)
    SEEN.append(ESCAPES.sub("", "".join(out)))
    return "".join(SEEN)


def press(browser, key: str) -> None:
    """A key press into the terminal, as a person would: click it, then type. While the page's
    overlay still covers the terminal (a loaded machine starts a tab's process slowly), wait for it."""

    from selenium.common.exceptions import ElementClickInterceptedException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        try:
            browser.find_element(By.CSS_SELECTOR, ".xterm").click()
        except ElementClickInterceptedException:
            return False
        return True

    until(clicked, 60, 0.2)
    ActionChains(browser).send_keys(key).perform()
