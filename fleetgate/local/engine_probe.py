"""Probes of one running local vLLM engine, shared by the engine and quantization benchmarks.

HTTP calls (a JSON POST, a streamed completion's token arrival times, the engine's `vllm:` metrics) and
the memory and CPU of the engine's process group read from /proc. Decode rate = (tokens - 1) / (time of
last token - time of first token).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

MODEL = "gemma-3-270m"


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as response:
        return dict(json.loads(response.read()))


def stream_times(url: str, *, prompt: str, max_tokens: int) -> tuple[float, list[float]]:
    """(request start, arrival time of each token event) for one streamed completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    arrivals: list[float] = []
    with urllib.request.urlopen(req, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    arrivals.append(time.monotonic())
    return start, arrivals


def decode_rate(arrivals: list[float]) -> float:
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0


def metric_values(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and " " in line:
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if name == "vllm:cache_config_info":
                values.update({f"cache_config.{k}": v for k, v in _labels(name_labels).items()})
            else:
                values[name] = values.get(name, 0.0) + float(value)
    return values


def _labels(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    inner = text.split("{", 1)[1].rstrip("}")
    for part in inner.split(","):
        key, _, raw = part.partition("=")
        try:
            out[key.strip()] = float(raw.strip().strip('"'))
        except ValueError:
            continue
    return out


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def group_memory_mib(pgid: int) -> dict[str, float]:
    """RSS and PSS summed over the process group; PSS splits shared pages (torch, weights) fairly."""
    rss_kib = pss_kib = 0
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            name = (entry / "comm").read_text().strip()
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss_kib += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss_kib += int(line.split()[1])
                    out[f"pss.{entry.name}.{name}"] = int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            continue
    return {"rss": rss_kib / 1024, "pss": pss_kib / 1024, **out}


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds consumed so far by the live processes of a process group."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")
