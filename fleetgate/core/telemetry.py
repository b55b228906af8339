"""Structured logging and the latency buckets every FleetGate histogram shares.

Metrics live in a `prometheus_client.CollectorRegistry` owned by each app instance (no
module-level registry), so several gateway apps can run in one process (tests, benchmarks).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

# Seconds. Fine resolution below 10 ms because gateway overhead targets are sub-millisecond.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
# Seconds per output token.
TPOT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)
# Plugin/decision timings (router, cache lookups): microseconds matter.
DECISION_BUCKETS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
)

# Not copied into the JSON: the standard attributes, and uvicorn's `color_message` (the message again,
# with terminal colour escapes, meant for its own coloured console formatter).
_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra={...}` fields are included as top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(payload, default=str).decode()


def configure_logging(*, level: str = "info", json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
