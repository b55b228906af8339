"""Read the KV-cache capacity a vLLM engine reports in its start-up log.

vLLM (0.32) logs, once the KV cache is allocated and before the API server binds its port:
`CPU KV cache size: 55,356 tokens, Maximum concurrency for 2,048 tokens per request: 27.03x`
("GPU KV cache size" on CUDA). `read_kv_capacity` parses that line; `wait_for_kv_capacity` polls a
log file for it, so a caller can compare the engine's own figures with the capacity plan without
waiting for the engine to become healthy.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(
    r"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class KvCapacity:
    device: str
    tokens: int
    max_model_len: int
    max_concurrency: float


def read_kv_capacity(text: str) -> KvCapacity | None:
    """The last KV-capacity line in `text`, or None when there is none yet."""
    matches = list(_LINE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    return KvCapacity(
        device=m["device"],
        tokens=int(m["tokens"].replace(",", "")),
        max_model_len=int(m["length"].replace(",", "")),
        max_concurrency=float(m["concurrency"]),
    )


def wait_for_kv_capacity(
    *, log_path: Path, timeout_s: float, alive: Callable[[], bool], poll_s: float = 1.0
) -> KvCapacity:
    """Poll `log_path` until the KV-capacity line appears; TimeoutError, or RuntimeError if the engine died."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = read_kv_capacity(log_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            found = None
        if found is not None:
            return found
        if not alive():
            raise RuntimeError(f"the engine exited before logging its KV cache size; see {log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no KV cache size in {log_path} after {timeout_s:.0f}s")
        time.sleep(poll_s)
