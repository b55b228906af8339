"""`fleetgate up --check`: one chat request through the gateway, so the README command is testable."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleetgate.local.errors import LocalStackError


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    answer: str
    completion_tokens: int
    seconds: float


async def send_check(*, gateway_url: str, model: str, prompt: str, timeout_s: float = 300.0) -> CheckResult:
    """POST one deterministic chat completion; raise `LocalStackError` unless it returns text."""
    import aiohttp

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "temperature": 0}
    start = time.monotonic()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.post(f"{gateway_url}/v1/chat/completions", json=body) as response,
        ):
            text = await response.text()
            if response.status != 200:
                raise LocalStackError(f"check failed: the gateway answered {response.status}: {text[:500]}")
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise LocalStackError(f"check failed: no answer from {gateway_url} ({exc!r})") from exc
    try:
        answer = str(data["choices"][0]["message"]["content"] or "").strip()
        tokens = int(data.get("usage", {}).get("completion_tokens", 0))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise LocalStackError(f"check failed: unexpected response shape: {str(data)[:500]}") from exc
    if not answer:
        raise LocalStackError(f"check failed: the model returned no text: {str(data)[:500]}")
    return CheckResult(answer=answer, completion_tokens=tokens, seconds=time.monotonic() - start)
