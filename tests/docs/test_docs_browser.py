"""One documentation page in real headless Chromium (Debian's chromium + chromedriver, driven by Selenium).

The built site is served on a loopback port; the page must render its navigation and tables, its search
must find a page, the browser console must stay free of warnings and errors, and every name but the
loopback address is unresolvable, so a request to the network would show up as a console error.
A screenshot is kept at artifacts/docs-reference.png.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO

pytestmark = [pytest.mark.browser, pytest.mark.slow]
LOOPBACK_ONLY = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


@pytest.fixture
def served(built_site: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _browse(url: str, screenshot: Path, chromium: Any) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(LOOPBACK_ONLY) as driver:
        driver.get(url + "/reference/gateway-config.html")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary"))
        out: dict[str, Any] = {
            "title": driver.title,
            "h1": driver.find_element(By.TAG_NAME, "h1").text,
            "rows": len(driver.find_elements(By.CSS_SELECTOR, "article table tbody tr")),
            "nav": driver.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute("textContent"),
        }
        driver.find_element(By.CSS_SELECTOR, "label.md-search__icon, .md-search__input").click()
        box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
        box.send_keys("capacityPlan")
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
        out["results"] = [e.get_attribute("textContent") for e in
                          driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item")]
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
        out["logs"] = driver.get_log("browser")
        return out


def test_a_reference_page_renders_and_searches_without_console_errors(served: str, chromium: Any) -> None:
    seen = _browse(served, REPO / "artifacts" / "docs-reference.png", chromium)
    assert seen["h1"].startswith("Gateway configuration") and "FleetGate" in seen["title"]
    assert seen["rows"] > 100  # every key is a table row
    assert "Reading the capacity plan" in seen["nav"] and "Tenants, keys and budgets" in seen["nav"]
    assert any("capacity" in r.lower() for r in seen["results"]), seen["results"][:3]
    problems = [e for e in seen["logs"] if e.get("level") not in ("DEBUG", "INFO")]
    assert not problems, problems
