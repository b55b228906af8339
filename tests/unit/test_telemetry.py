"""The JSON log formatter: one clean object per line."""

from __future__ import annotations

import logging

import orjson

from fleetgate.core.telemetry import JsonFormatter


def test_json_lines_carry_extras_but_no_terminal_colour_codes() -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (7,), None)
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"  # what uvicorn attaches
    record.request_id = "r1"
    line = JsonFormatter().format(record)
    assert "\x1b" not in line and "\\u001b" not in line
    payload = orjson.loads(line)
    assert payload["msg"] == "Started server process [7]" and payload["request_id"] == "r1"
    assert "color_message" not in payload
