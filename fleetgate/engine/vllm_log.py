"""Read what a vLLM engine says about its memory and start-up in its log.

vLLM logs, while it starts (0.26 on CUDA; 0.32 words the KV line differently, both are read):
- `Model loading took 17.05 GiB memory and 3.2 seconds`: the weights of this GPU (with LoRA slots and a
  draft model, which load with them);
- `Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)` and
  `Estimated CUDA graph memory: 0.47 GiB total`: what is set aside for CUDA graphs before the KV cache;
- `Available KV cache memory: 51.86 GiB`;
- `GPU KV cache size: 424,864 tokens` and `Maximum concurrency for 8,192 tokens per request: 51.86x`
  (0.32 and CPU: one line, `CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: Xx`);
- `Free memory on device (78.9/79.65 GiB) on startup. Desired GPU memory utilization is (0.9, 71.68 GiB).
  Actual usage is 17.05 GiB for weight, 2.1 GiB for peak activation, 0.2 GiB for non-torch memory, and
  0.95 GiB for CUDAGraph memory. ...`: the split of what is not KV cache (CUDA graphs as captured);
- `CUDA graph pool memory: 0.95 GiB (actual), 0.47 GiB (estimated), ...`;
- `init engine (profile, create kv cache, warmup model) took 71.3 s (compilation: 40.1 s)`;
- `Using FLASH_ATTN attention backend out of potential backends: [...]`.
Lines carry a `(Worker_TP0 pid=..)` / `(EngineCore pid=..)` prefix and `INFO MM-DD HH:MM:SS [file:line]`;
under tensor parallelism each rank logs its own memory lines and the first one (rank 0) is kept.
`parse_engine_log` returns an `EngineLogReport` whose missing figures are None; `failure_reason` picks the
line that says why an engine that exited did not start (the last exception line that is not one of vLLM's
"... initialization failed" wrappers, which name no cause).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 2**30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([\d,]+(?:\.\d+)?)"


def _n(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineLogReport:
    weights_gib: float | None = None
    load_seconds: float | None = None
    available_kv_gib: float | None = None
    kv_device: str | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    total_gib: float | None = None  # the GPU's total memory as vLLM sees it
    free_gib: float | None = None  # free at start-up
    requested_gib: float | None = None  # total x gpu_memory_utilization
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None  # as captured
    cuda_graph_estimate_gib: float | None = None  # as set aside before sizing the KV cache
    cuda_graphs: dict[str, int] = field(default_factory=dict)  # mode -> graphs captured
    init_engine_seconds: float | None = None
    compile_seconds: float | None = None
    attention_backend: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PATTERNS: dict[str, re.Pattern[str]] = {
    "load": re.compile(rf"Model loading took {_NUM} GiB(?: memory)? and {_NUM} seconds"),
    "available": re.compile(rf"Available KV cache memory: {_NUM} GiB"),
    "kv": re.compile(rf"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: {_NUM} tokens"),
    "concurrency": re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
    "split": re.compile(
        rf"Free memory on device \({_NUM}/{_NUM} GiB\) on startup\. Desired GPU memory utilization is "
        rf"\([\d.]+, {_NUM} GiB\)\. Actual usage is {_NUM} GiB for weight, {_NUM} GiB for peak activation, "
        rf"{_NUM} GiB for non-torch memory, and {_NUM} GiB for CUDAGraph memory"
    ),
    "graphs": re.compile(r"Profiling CUDA graph memory: (?P<groups>.+)$"),
    "graph_estimate": re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total"),
    "init": re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s(?:econds)?"
                       rf"(?: \(compilation: {_NUM} s)?"),
    "backend": re.compile(r"Using (?:AttentionBackendEnum\.)?(?P<name>[A-Z0-9_]+) (?:attention )?backend"),
}  # fmt: skip
_GRAPH_GROUP = re.compile(r"(?P<mode>[A-Z_]+)=(?P<count>\d+)")


def _first(lines: list[str], key: str) -> re.Match[str] | None:
    pattern = _PATTERNS[key]
    for line in lines:
        m = pattern.search(line)
        if m:
            return m
    return None


def parse_engine_log(text: str) -> EngineLogReport:
    """The figures found in a vLLM start-up log (None where a line is absent)."""
    lines = _ANSI.sub("", text).splitlines()
    values: dict[str, Any] = {}
    if m := _first(lines, "load"):
        values.update(weights_gib=_n(m[1]), load_seconds=_n(m[2]))
    if m := _first(lines, "available"):
        values["available_kv_gib"] = _n(m[1])
    if m := _first(lines, "kv"):
        values.update(kv_device=m["device"], kv_tokens=int(_n(m[2])))
    if m := _first(lines, "concurrency"):
        values.update(max_model_len=int(_n(m[1])), max_concurrency=_n(m[2]))
    if m := _first(lines, "split"):
        free, total, requested, _weight, activation, non_torch, graphs = (_n(g) for g in m.groups())
        values.update(free_gib=free, total_gib=total, requested_gib=requested, activation_gib=activation,
                      non_torch_gib=non_torch, cuda_graph_gib=graphs)  # fmt: skip
    if m := _first(lines, "graphs"):
        values["cuda_graphs"] = {g["mode"]: int(g["count"]) for g in _GRAPH_GROUP.finditer(m["groups"])}
    if m := _first(lines, "graph_estimate"):
        values["cuda_graph_estimate_gib"] = _n(m[1])
    if m := _first(lines, "init"):
        values["init_engine_seconds"] = _n(m[1])
        if m[2] is not None:
            values["compile_seconds"] = _n(m[2])
    if m := _first(lines, "backend"):
        values["attention_backend"] = m["name"]
    return EngineLogReport(**values)


_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")
_ERROR = re.compile(r"^(?:[\w.]+\.)?(?:\w*Error|\w*Exception|AssertionError)(?:\[[^\]]*\])?: .+|^\s*Value error, .+")


def failure_reason(text: str, *, limit: int = 600) -> str | None:
    """The last exception line of a log (the reason an engine exited), stripped of vLLM's prefix."""
    found: str | None = None
    for raw in _ANSI.sub("", text).splitlines():
        line = _PREFIX.sub("", raw).strip()
        if _ERROR.match(line) and "initialization failed" not in line:  # vLLM's wrappers name no cause
            found = line
    return found[:limit] if found else None
