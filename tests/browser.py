"""A real headless browser for the tests: Chromium from the system's packages, driven by Selenium.

Where there is none the tests that need it skip, saying how to install one (.ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
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
