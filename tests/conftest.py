"""Fixtures shared by every test tier.

Real components where they matter: `redis_url` starts a real `redis-server` on a free loopback
port for the session (contract and Redis-backed tests), and is flushed between tests.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetgate.core.localredis import LocalRedis

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    with LocalRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1800")
OpenChromium = Callable[..., AbstractContextManager[Any]]


@pytest.fixture(scope="session")
def chromium() -> OpenChromium:
    """Opens Debian's headless Chromium through Selenium with its console log kept (browser tests)."""
    if shutil.which(CHROMIUM) is None or shutil.which(CHROMEDRIVER) is None:
        pytest.fail("chromium and chromium-driver are not installed: run scripts/install (Debian packages)")

    @contextmanager
    def open_browser(extra_flags: Sequence[str] = ()) -> Iterator[Any]:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        options.binary_location = CHROMIUM
        profile = tempfile.mkdtemp(prefix="fleetgate-chromium-")
        for flag in [*CHROMIUM_FLAGS, *extra_flags, f"--user-data-dir={profile}"]:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # An explicit driver path: Selenium Manager never tries to download anything.
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
        try:
            yield driver
        finally:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)

    return open_browser
