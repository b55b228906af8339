"""What `fleetgate up` prints once the stack is serving: URL, a curl to paste, metrics and logs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from fleetgate.gateway.settings import GatewaySettings


def curl_example(*, gateway_url: str, model: str, api_key: bool) -> str:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 32,
        }
    )
    parts = ["curl", "-s", f"{gateway_url}/v1/chat/completions", "-H", "Content-Type: application/json"]
    if api_key:
        parts += ["-H", "Authorization: Bearer $FLEETGATE_API_KEY"]
    parts += ["-d", body]
    return " ".join(shlex.quote(p) if not p.startswith("Authorization") else f'"{p}"' for p in parts)


def banner(
    *,
    gateway_url: str,
    settings: GatewaySettings,
    model: str,
    engine_urls: Sequence[str],
    log_dir: Path | None,
    metrics_url: str | None = None,
    adapters: Sequence[str] = (),
    encoder_url: str | None = None,
) -> str:
    lines = [
        "",
        f"FleetGate is up: {gateway_url}  ->  {len(engine_urls)} engine(s) serving {model!r}",
        "",
        "  try it:",
        "    " + curl_example(gateway_url=gateway_url, model=model, api_key=settings.server.auth == "api_key"),
        f"    (OpenAI SDK: base_url={gateway_url}/v1, any api_key in open mode)",
        *([f"    LoRA adapters on {model!r}, asked for by name: {', '.join(adapters)}"] if adapters else []),
        "",
        f"  gateway metrics: {metrics_url or '(off: server.metrics_port is null)'}",
        "  engine metrics:  " + ", ".join(f"{u}/metrics" for u in engine_urls),
        *([f"  cache encoder:   {encoder_url} (all-MiniLM-L6-v2, vLLM CPU pooling engine, float32)"]
          if encoder_url else []),
    ]
    if log_dir is not None:
        lines.append(f"  engine logs:     {log_dir}/engine-<i>.log")
    lines += ["", "  Ctrl-C stops everything.", ""]
    return "\n".join(lines)
