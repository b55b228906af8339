"""Exact prompt token counts from the engine itself: vLLM's `POST /tokenize`, which renders the chat template.

Used only where the cheap bound (`prompt_bound`) would refuse a request (`estimate.reserve_request`), so the
hot path never pays for it: one HTTP round trip to an engine of the model, the engine's CPU for templating and
tokenizing, and about 0.3-0.5 ms of gateway CPU (`fleetgate bench estimate`).

vLLM's `/tokenize` takes a chat request's `messages`, `tools`, `chat_template_kwargs`, `add_generation_prompt`,
`continue_final_message`, `add_special_tokens`, `mm_processor_kwargs` and `chat_template`; what the chat route
also hands the template (`documents`, `reasoning_effort`) is passed through `chat_template_kwargs`, the way
vLLM merges them. Two things the chat route may render and `/tokenize` cannot take (`tool_choice`,
`response_format`: some templates state them) are added as their JSON bytes, so the count stays an upper bound.
A `/v1/completions` prompt list is counted prompt by prompt (token-id prompts need no count).

Any failure (no endpoint, the model scaled to zero, an engine without `/tokenize`, a timeout, an answer that
is not a count) is None: the caller keeps the bound.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson

from fleetgate.core.types import Endpoint
from fleetgate.gateway.discovery import EndpointSource, adapter_named
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.prompt_bound import PromptTally, add_json

log = logging.getLogger("fleetgate.gateway.tokens")

CHAT_FIELDS = ("messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
               "add_special_tokens", "mm_processor_kwargs", "chat_template")
TEMPLATE_KWARGS = ("documents", "reasoning_effort")  # the chat route passes these to the template
UNCOUNTED = ("tool_choice", "response_format")  # may be rendered by the chat route; `/tokenize` takes neither


def _count(answer: Any) -> int | None:
    count = answer.get("count") if isinstance(answer, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def tokenize_bodies(kind: Kind, body: Mapping[str, Any], *, served: str) -> tuple[list[dict[str, Any]], int]:
    """The `/tokenize` requests for one request, and the tokens to add to their counts (see module doc);
    ([], 0) when nothing needs counting (token-id prompts)."""
    if kind == "chat":
        out: dict[str, Any] = {"model": served, **{k: body[k] for k in CHAT_FIELDS if body.get(k) is not None}}
        extra = {k: body[k] for k in TEMPLATE_KWARGS if body.get(k) is not None}
        if "reasoning_effort" in extra and "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
            extra["enable_thinking"] = extra["reasoning_effort"] != "none"
        if extra:
            out["chat_template_kwargs"] = {**extra, **(body.get("chat_template_kwargs") or {})}
        margin = PromptTally(templated=False)
        for key in UNCOUNTED:
            if body.get(key) is not None:
                add_json(margin, body[key])
        return [out], margin.bytes
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    if any(not isinstance(p, str) for p in prompts):
        return [], 0  # token ids are counted exactly by the bound; a mixed list is not a valid request
    return [{"model": served, "prompt": p, "add_special_tokens": body.get("add_special_tokens", True)}
            for p in prompts], 0


class EngineTokenCounter:
    """Counts with `/tokenize` on an endpoint of the requested model."""

    def __init__(self, *, source: EndpointSource, session: Callable[[], aiohttp.ClientSession],
                 timeout_s: float = 2.0) -> None:
        self._source = source
        self._session = session
        self._timeout_s = timeout_s

    def _endpoint(self, model: str) -> tuple[Endpoint, str] | None:
        endpoints = self._source.endpoints(model)
        if not endpoints:
            return None
        endpoint = random.choice(endpoints)  # spreading the load, not security
        spec = adapter_named(self._source, model)
        return endpoint, spec.name if spec is not None else endpoint.model

    async def count(self, *, kind: Kind, model: str, body: Mapping[str, Any]) -> list[int] | None:
        """The prompt tokens the engine reads, per prompt (one for chat); None when it cannot say."""
        target = self._endpoint(model)
        if target is None:
            return None
        endpoint, served = target
        requests, margin = tokenize_bodies(kind, body, served=served)
        if not requests:
            return None
        try:
            async with asyncio.timeout(self._timeout_s):
                counts = [await self._one(endpoint, r) for r in requests]
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("exact token count failed", extra={"endpoint": endpoint.id, "error": repr(exc)})
            return None
        if any(c is None for c in counts):
            return None
        return [c + margin for c in counts if c is not None]

    async def _one(self, endpoint: Endpoint, request: dict[str, Any]) -> int | None:
        headers = {"Content-Type": "application/json", "User-Agent": "fleetgate", "Accept-Encoding": "identity"}
        async with self._session().post(endpoint.url + "/tokenize", data=orjson.dumps(request),
                                        headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                log.warning("exact token count refused", extra={"endpoint": endpoint.id, "status": resp.status,
                                                               "body": raw[:500].decode("utf-8", "replace")})
                return None
        try:
            return _count(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return None
