"""The end-to-end tests' JSON-over-HTTP helper (standard library only: no event loop in the fixtures)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request_json(url: str, body: dict[str, Any] | None = None, *, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a GET (`body` None) or a JSON POST; an HTTP error's status and body (empty: {})."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
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
