"""The end-to-end tests' JSON-over-HTTP helper (standard library only: no event loop in the fixtures)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def request_json(url: str, body: dict[str, Any] | None = None, *, timeout: float = 300,
                 key: str | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a GET (`body` None) or a JSON POST, with `key` as a bearer token if given; an HTTP
    error's status and body (empty: {})."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def post_json_headers(url: str, body: dict[str, Any], *, timeout: float = 300
                      ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, lower-cased response headers) of a JSON POST that must succeed or fail with JSON."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            headers = {k.lower(): v for k, v in response.headers.items()}
            return response.status, json.loads(response.read()), headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), {k.lower(): v for k, v in exc.headers.items()}


def tenant_ledger(gateway: str, *, admin: str, key: str) -> tuple[dict[str, int], int]:
    """The gateway's usage totals (read with the admin key) and the tenant's daily budget used (with its own key,
    the tenant's first budget), after a pause for the accounting that runs after each response."""
    time.sleep(0.5)
    status, report = request_json(f"{gateway}/v1/usage", key=admin, timeout=30)
    assert status == 200, report
    status, budgets = request_json(f"{gateway}/v1/usage/budgets", key=key, timeout=30)
    assert status == 200, budgets
    return report["totals"], int(budgets["data"][0]["windows"]["daily_budget"]["used"])
