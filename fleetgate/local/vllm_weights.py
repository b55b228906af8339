"""The weight-memory line the vLLM plugin logs in an engine (`fleetgate.local.vllm_plugin`), and its parser.

vLLM's CPU backend logs no weight memory (its GPU runner's "Model loading took X GiB" has no CPU twin), so
with `$FLEETGATE_LOG_WEIGHT_BYTES=1` the plugin logs, once the worker has loaded the model:
`fleetgate: model weights in memory: <T> tensor bytes, <R> rss bytes, <A> anon bytes` (T: bytes of the
model's parameters and buffers, tied storage counted once, which misses weights a kernel moved into its own
buffers; R: the worker's RSS growth over the load; A: the growth of its anonymous RSS, i.e. without pages
of the mapped checkpoint file: the memory the loaded weights take). Kept apart from the plugin so that
reading a log imports no vLLM.
"""

from __future__ import annotations

import re

WEIGHT_BYTES_ENV = "FLEETGATE_LOG_WEIGHT_BYTES"
WEIGHT_BYTES_LINE = "fleetgate: model weights in memory:"
_PATTERN = re.compile(re.escape(WEIGHT_BYTES_LINE) + r" (\d+) tensor bytes, (-?\d+) rss bytes, (-?\d+) anon bytes")


def weight_bytes_line(*, tensor_bytes: int, rss_bytes: int, anon_bytes: int) -> str:
    return f"{WEIGHT_BYTES_LINE} {tensor_bytes} tensor bytes, {rss_bytes} rss bytes, {anon_bytes} anon bytes"


def parse_weight_bytes(log: str) -> tuple[int, int, int] | None:
    """(tensor bytes, RSS growth, anonymous RSS growth) from an engine log; the last report wins."""
    found = _PATTERN.findall(log)
    return (int(found[-1][0]), int(found[-1][1]), int(found[-1][2])) if found else None
