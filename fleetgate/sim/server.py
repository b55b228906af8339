"""The OpenAI-compatible HTTP face of one simulated engine (aiohttp, loopback by default).

Routes, as vLLM serves them: `POST /v1/chat/completions`, `POST /v1/completions` (both with `stream`,
`stream_options.include_usage` and `continuous_usage_stats`), `GET /v1/models`, `GET /health`, `GET /metrics`,
and vLLM's development route `POST /reset_prefix_cache`.
With LoRA enabled (`SimProfile.enable_lora`) a request's `model` may name a registered adapter (unknown
names get vLLM's 404), `/v1/models` lists each adapter with `parent` = the base model and `root` = its
path, and with `allow_runtime_lora_updating` (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) the server
also answers `POST /v1/load_lora_adapter {lora_name, lora_path}` (200 once loaded; 400 already loaded or
rank too large) and `POST /v1/unload_lora_adapter {lora_name}` (200; 404 when not loaded).
`usage.prompt_tokens_details.cached_tokens` reports the prefix-cache hit. Chat messages are
serialised with a Gemma-style template before tokenisation, so a shared system prompt and a growing
history form a shared prefix.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetgate.sim.engine import SimEngine, SimRequest
from fleetgate.sim.lora import LoraError
from fleetgate.sim.metrics import SimMetrics
from fleetgate.sim.openai_fields import requested_max_tokens
from fleetgate.sim.runner import EngineRunner

ENGINE_KEY = web.AppKey("engine", EngineRunner)
METRICS_KEY = web.AppKey("metrics", SimMetrics)


def render_chat(messages: list[Mapping[str, Any]]) -> str:
    """A stable serialisation of chat messages (Gemma's turn markers)."""
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append(f"<start_of_turn>{m.get('role', 'user')}\n{content}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _error(status: int, message: str, code: str | int, err_type: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return web.json_response(body, status=status, dumps=lambda o: orjson.dumps(o).decode())


def _usage(req: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.generated,
        "total_tokens": req.prompt_tokens + req.generated,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def _natural_length(prompt: str, bounds: tuple[int, int] | None) -> int | None:
    """A deterministic per-prompt answer length in [lo, hi] tokens (None: run to max_tokens)."""
    if bounds is None:
        return None
    lo, hi = bounds
    return lo + int.from_bytes(hashlib.sha1(prompt.encode()).digest()[:4], "big") % (hi - lo + 1)


def _text(start: int, end: int) -> str:
    return "".join(f" w{i}" for i in range(start, end))


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    runner = request.app[ENGINE_KEY]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _error(400, "request body is not valid JSON", "invalid_json")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "invalid_request")
    model = runner.engine.profile.model
    asked = body.get("model")
    adapter: str | None = None
    if asked not in (None, model):
        if not isinstance(asked, str) or asked not in runner.engine.adapters():
            return _error(404, f"The model `{asked}` does not exist.", "model_not_found")
        adapter = model = asked  # vLLM answers with the adapter's name as the model
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "`messages` must be a non-empty list", "invalid_messages")
        prompt = render_chat(messages)
    else:
        raw = body.get("prompt")
        first = raw[0] if isinstance(raw, list) and raw else raw
        if not isinstance(first, str):
            return _error(400, "`prompt` must be a string", "invalid_prompt")
        prompt = first
    max_tokens = requested_max_tokens(body, chat=chat)
    profile = runner.engine.profile
    requested = int(max_tokens) if max_tokens is not None else profile.default_max_tokens
    natural = _natural_length(prompt, profile.natural_tokens)
    finish_reason = "stop" if natural is not None and natural < requested else "length"
    tag = f"[answer:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}]" if profile.answer_tag else ""
    try:
        req, updates = runner.submit(prompt=prompt, max_tokens=min(requested, natural or requested), adapter=adapter)
    except LoraError as exc:
        return _error(exc.status, str(exc), "model_not_found")
    except ValueError as exc:
        return _error(400, str(exc), "context_length_exceeded")
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    try:
        if not body.get("stream"):
            while not req.done:
                await updates.get()
            text = tag + _text(0, req.generated)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                       "usage": _usage(req)}
            return web.Response(body=orjson.dumps(payload), content_type="application/json")
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        # vLLM's continuous_usage_stats: the usage so far on every chunk, so a client that leaves mid-stream
        # still knows what the engine generated.
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        while True:
            if sent >= req.generated:
                if req.done:
                    break
                await updates.get()
                continue
            new = (tag if sent == 0 else "") + _text(sent, req.generated)
            first, sent = sent == 0, req.generated
            finish = finish_reason if req.done and sent >= req.generated else None
            ch: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                ch["delta"] = {"role": "assistant", "content": new} if first else {"content": new}
            else:
                ch["text"] = new
            chunk = {"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [ch]}
            if continuous:
                chunk["usage"] = _usage(req)
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if include_usage:
            tail = {"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [],
                    "usage": _usage(req)}
            await resp.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        runner.engine.abort(req)  # no-op when finished; frees KV when the client went away


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY].engine
    model = engine.profile.model
    entries: list[dict[str, Any]] = [{"id": model, "object": "model", "created": 0, "owned_by": "fleetgate-sim",
                                      "root": model, "parent": None}]
    if engine.lora is not None:
        entries += [{"id": a.name, "object": "model", "created": 0, "owned_by": "fleetgate-sim", "root": a.path,
                     "parent": model} for a in engine.lora.registered.values()]
    return web.Response(body=orjson.dumps({"object": "list", "data": entries}), content_type="application/json")


async def _json_object(request: web.Request) -> dict[str, Any] | None:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


async def load_lora_adapter(request: web.Request) -> web.Response:
    runner = request.app[ENGINE_KEY]
    body = await _json_object(request)
    name = body.get("lora_name") if body else None
    path = body.get("lora_path") if body else None
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", 400, "BadRequestError")
    if name == runner.engine.profile.model:
        return _error(400, f"The lora adapter '{name}' has already been loaded.", 400, "BadRequestError")
    try:
        await runner.load_adapter(name=name, path=path)
    except LoraError as exc:
        return _error(exc.status, str(exc), exc.status, "BadRequestError")
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    runner = request.app[ENGINE_KEY]
    body = await _json_object(request)
    name = body.get("lora_name") if body else None
    if not isinstance(name, str) or not name:
        return _error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", 400, "BadRequestError")
    try:
        runner.engine.unload(name)
    except LoraError as exc:
        return _error(exc.status, str(exc), exc.status, "NotFoundError" if exc.status == 404 else "BadRequestError")
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's development endpoint (served with `VLLM_SERVER_DEV_MODE=1`): `{"success": false}` while requests
    hold blocks, so a benchmark drains first and may retry."""
    done = request.app[ENGINE_KEY].engine.reset_prefix_cache()
    return web.Response(body=orjson.dumps({"success": done}), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(engine: SimEngine) -> web.Application:
    """One engine's app; the caller owns the runner's lifetime through the app's startup/cleanup."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    runner = EngineRunner(engine)
    app[ENGINE_KEY] = runner
    app[METRICS_KEY] = SimMetrics(engine)

    async def on_startup(_: web.Application) -> None:
        runner.start()

    async def on_cleanup(_: web.Application) -> None:
        await runner.aclose()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    if engine.profile.enable_lora and engine.profile.allow_runtime_lora_updating:
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app
