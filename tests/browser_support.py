"""A real HTTP server for an app, and headless Chromium (Debian's chromium + chromium-driver)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading

import pytest

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_CANDIDATES = ("chromedriver",)


def _which(names) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
        if os.path.exists(f"/usr/lib/chromium/{name}"):  # Debian's layout when /usr/bin is not on PATH
            return f"/usr/lib/chromium/{name}"
    return None


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) or a skip naming what is missing; CI installs both (see .ci/run)."""
    browser, driver = _which(CHROMIUM_CANDIDATES), _which(DRIVER_CANDIDATES)
    if not browser or not driver:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromium-driver", driver)) if not p)
        reason = (f"{missing} not installed: browser tests need Debian's chromium + chromium-driver "
                  "(`apt-get install -y chromium chromium-driver`; .ci/run installs them)")
        if os.environ.get("REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return browser, driver


@contextlib.contextmanager
def live_server(app):
    """Serve `app` on 127.0.0.1 and a free port in a thread; yields the base URL."""
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log per asset
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="live-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def chromium_driver(width: int = 1400, height: int = 1000):
    """A headless Chromium WebDriver; console messages are readable with get_log('browser')."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--force-device-scale-factor=1",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
