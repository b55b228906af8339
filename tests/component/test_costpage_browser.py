"""The built-in cost page in real headless Chromium (Debian's chromium + chromedriver, driven by Selenium).

Real requests go through a real gateway to a fake engine; the page then loads the usage API with the
admin's key and must render its charts from that data, without a single console error. A screenshot
is kept at artifacts/costpage.png.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
KEYS = {name: new_key() for name in ("acme", "globex", "initech", "admin")}


def settings(engine_url: str) -> GatewaySettings:
    price = {"input_usd_per_1m": "0.5", "output_usd_per_1m": "1.5"}
    strong = {"input_usd_per_1m": "5", "output_usd_per_1m": "15"}
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key"},
        "models": [{"name": "small", "endpoints": [engine_url]}, {"name": "large", "endpoints": [engine_url]}],
        "tenancy": {
            "admin_key_hashes": [KEYS["admin"][1]],
            "tenants": [
                {"id": "acme", "name": "Acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "0.05",
                 "monthly_budget_usd": "1", "rpm": 600, "model_budgets": {"small": {"daily_budget_usd": "1"}}},
                {"id": "globex", "name": "Globex", "key_hashes": [KEYS["globex"][1]], "daily_budget_usd": "0.02"},
                {"id": "initech", "key_hashes": [KEYS["initech"][1]]},
            ],
            "prices": {"small": price, "large": strong},
            "savings_baseline_model": "large",
        },
    })


def problems(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Console entries that are errors or warnings (Chromium's DEBUG-level DOM recommendations are not)."""
    return [e for e in logs if e.get("level") not in ("DEBUG", "INFO")]


def browser_session(url: str, *, key: str | None, screenshot: Path | None, chromium: Any) -> dict[str, Any]:
    """Open the page, load it with `key` (None: let it load by itself), read back what it drew (in a thread)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(url + "/dashboard")
        if key is not None:
            driver.find_element(By.ID, "key").send_keys(key)
            driver.find_element(By.ID, "load").click()
        WebDriverWait(driver, 20).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("ready", "error")
        )

        def bars(chart: str) -> list[dict[str, str]]:
            rects = driver.find_elements(By.CSS_SELECTOR, f"#{chart} rect.bar")
            return [{"series": r.get_attribute("data-series") or "", "value": r.get_attribute("data-value") or "0"}
                    for r in rects]

        out = {
            "state": driver.find_element(By.TAG_NAME, "body").get_attribute("data-state"),
            "status": driver.find_element(By.ID, "status").text,
            "daily": bars("chart-daily"),
            "models": bars("chart-models"),
            "tenants_daily": bars("chart-tenants-daily"),
            "top": bars("chart-top-tenants"),
            "budgets": [(b.get_attribute("data-tenant"), b.get_attribute("data-window"))
                        for b in driver.find_elements(By.CSS_SELECTOR, "#budgets .budget")],
            "spend_kpi": driver.find_element(By.ID, "kpi-spend").text,
            "table_rows": len(driver.find_elements(By.CSS_SELECTOR, "#table-models tbody tr")),
            "logs": driver.get_log("browser"),
        }
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
        return out


async def make_traffic(url: str) -> None:
    plan = [("acme", "small", 9, False), ("acme", "large", 5, True), ("acme", "small", 14, True),
            ("globex", "small", 20, False), ("globex", "large", 3, False), ("initech", "small", 6, True)]
    async with httpx.AsyncClient(base_url=url, timeout=20) as c:
        for tenant, model, n, stream in plan:
            body = {"model": model, "max_tokens": n * 40, "stream": stream,
                    "messages": [{"role": "user", "content": "word " * (n * 30)}]}
            r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant][0]}"})
            assert r.status_code == 200


@pytest.fixture
async def loaded_gateway(engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]) -> RunningGateway:
    gw = await start_gateway(settings(engine.url))
    await make_traffic(gw.url)
    await gw.pipeline.drain()
    return gw


async def test_cost_page_renders_real_usage_without_console_errors(loaded_gateway: RunningGateway,
                                                                   chromium: Any) -> None:
    gw = loaded_gateway
    async with httpx.AsyncClient(base_url=gw.url) as c:
        report = (await c.get("/v1/usage", headers={"Authorization": f"Bearer {KEYS['admin'][0]}"})).json()
    page = await asyncio.to_thread(browser_session, gw.url, key=KEYS["admin"][0],
                                   screenshot=ARTIFACTS / "costpage.png", chromium=chromium)
    assert problems(page["logs"]) == [], page["logs"]
    assert page["state"] == "ready", page["status"]
    totals = report["totals"]
    spend = sum(float(b["value"]) for b in page["daily"] if b["series"] == "spend")
    saved_tier = sum(float(b["value"]) for b in page["daily"] if b["series"] == "saved by tiering")
    assert spend == pytest.approx(totals["cost_usd"], rel=1e-9) and spend > 0
    assert saved_tier == pytest.approx(totals["saved_tier_usd"], rel=1e-9) and saved_tier > 0
    assert {b["series"] for b in page["models"]} == {"small", "large"}
    assert {b["series"] for b in page["tenants_daily"]} == {"acme", "globex", "initech"}
    top = {b["series"]: float(b["value"]) for b in page["top"]}
    assert top == pytest.approx({g["tenant"]: g["cost_usd"] for g in report["by_tenant"]})
    assert ("acme", "daily_budget") in page["budgets"] and ("globex", "daily_budget") in page["budgets"]
    assert ("acme", "model_daily_budget:small") in page["budgets"]  # a per-model (per-adapter) cap has its bar
    assert page["table_rows"] == 2  # small and large (no tier set)
    assert (ARTIFACTS / "costpage.png").stat().st_size > 10_000


async def test_cost_page_shows_one_tenant_and_rejects_a_wrong_key(loaded_gateway: RunningGateway,
                                                                  chromium: Any) -> None:
    page = await asyncio.to_thread(browser_session, loaded_gateway.url, key=KEYS["globex"][0], screenshot=None,
                                   chromium=chromium)
    assert page["state"] == "ready" and problems(page["logs"]) == []
    assert {b["series"] for b in page["top"]} == {"globex"}
    assert {t for t, _ in page["budgets"]} == {"globex"}
    wrong = await asyncio.to_thread(browser_session, loaded_gateway.url, key="fg-not-a-key", screenshot=None,
                                    chromium=chromium)
    assert wrong["state"] == "error" and "invalid API key" in wrong["status"]
    # The failed fetch is logged by Chromium as a network error (401); nothing else may be.
    assert all("401" in entry["message"] for entry in problems(wrong["logs"])), wrong["logs"]


async def test_cost_page_loads_without_a_key_when_auth_is_off(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]], chromium: Any
) -> None:
    local = settings(engine.url).model_copy(deep=True)
    local.server.auth = "open"
    gw = await start_gateway(local)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        body = {"model": "small", "max_tokens": 50, "messages": [{"role": "user", "content": "word " * 40}]}
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
    await gw.pipeline.drain()
    page = await asyncio.to_thread(browser_session, gw.url, key=None, screenshot=None, chromium=chromium)
    assert page["state"] == "ready" and problems(page["logs"]) == [], (page["status"], page["logs"])
    assert {b["series"] for b in page["top"]} == {"anonymous"}
