"""The fake engine's `/v1/responses`, `/v1/messages` and `/v1/embeddings`, in vLLM 0.32's shapes.

Same deterministic behaviour as its chat route (`fake_engine`): the text is `"t0 t1 ..."`, one token per
delta event, as many as the request's output limit (`max_output_tokens`, `max_tokens`; the config's default
otherwise), exact usage, and the same faults (a failing status in the API's error shape, garbage, a usage
override, dropping or going silent after some deltas, running past the limit). The prompt it reads is counted
as for chat (`prompt_tokens_of`) over what vLLM renders: a Responses request's `instructions` and what each input
item holds (`_read`), a Messages request's `system` and messages, and the tools; `/v1/messages/count_tokens`
counts a Messages request the same way. Streams are named events ending with
`response.completed` / `message_stop` and no `[DONE]`, as vLLM's; usage arrives only at the end, as there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

EMBEDDING_DIM = 8


async def paced_tokens(request: web.Request, config: FakeEngineConfig, n: int) -> AsyncIterator[int]:
    """Token numbers 0..n-1 as the config paces them: a delay between tokens, the connection dropped or the
    engine silent after `drop_after_chunks` / `hang_after_chunks` tokens."""
    for i in range(n):
        if config.drop_after_chunks is not None and i >= config.drop_after_chunks:
            if request.transport is not None:
                request.transport.close()
            return
        if config.hang_after_chunks is not None and i >= config.hang_after_chunks:
            await asyncio.sleep(3600)
        if i and config.inter_token_delay_s:
            await asyncio.sleep(_delay(config))
        yield i


def _delay(config: FakeEngineConfig) -> float:
    """Seconds to the next token: the inter-token delay, or with `step_sync` to the next step of the shared clock."""
    step = config.inter_token_delay_s
    if not config.step_sync:
        return step
    now = asyncio.get_running_loop().time()
    return step - now % step or step


def dropped(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


def _read(item: Any) -> dict[str, Any]:
    """What vLLM reads of one input item: a message's content (an output message's first part), a tool call's
    id, name and arguments, a tool output's id and output, a reasoning item's text; never item ids or statuses."""
    if not isinstance(item, dict):
        return {"role": "user", "content": item}
    kind = item.get("type", "message" if "role" in item else None)
    content = item.get("content")
    if kind == "message":
        if item.get("role") == "assistant" and isinstance(content, list) and content:
            content = content[0].get("text") if isinstance(content[0], dict) else content[0]
        return {"role": item.get("role"), "content": content}
    if kind in ("function_call", "custom_tool_call"):
        return {"role": "assistant", "content": [item.get("call_id"), item.get("name"),
                                                 item.get("arguments", item.get("input"))]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": [item.get("call_id"), item.get("output")]}
    if kind == "reasoning":
        parts = content or item.get("summary") or []
        return {"role": "assistant", "content": parts[0].get("text") if parts and isinstance(parts[0], dict) else ""}
    return {"role": "user", "content": None}


def responses_prompt(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat messages (and tools) vLLM renders from it."""
    value = body.get("input")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])
    system = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    return {"messages": system + [_read(item) for item in items], "tools": body.get("tools")}


def messages_prompt(body: dict[str, Any]) -> dict[str, Any]:
    system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    return {"messages": system + list(body.get("messages") or []), "tools": body.get("tools")}


class FakeApiRoutes:
    """The three routes over one `FakeEngine` (its config, stats and record of what it received)."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def install(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1/embeddings", self._embeddings)

    # ---- shared --------------------------------------------------------------------------------------------

    async def _begin(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """The body, and the answer when the config makes the engine fail (in the route's error shape)."""
        from fleetgate.sim.fake_engine import Received

        cfg, stats = self._engine.config, self._engine.stats
        body = orjson.loads(await request.read())
        stats.requests += 1
        stats.received.append(Received(request.path, body, {k.lower(): v for k, v in request.headers.items()}))
        if cfg.fail_status is not None:
            if request.path == "/v1/messages":
                error: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": cfg.fail_message}}
            else:
                error = {"error": {"message": cfg.fail_message, "type": "BadRequestError" if cfg.fail_status < 500
                                   else "InternalServerError", "param": None, "code": cfg.fail_status}}
            return body, _json(error, cfg.fail_status)
        if cfg.garbage:
            return body, web.Response(body=b"<html>oops</html>", content_type="text/html")
        return body, None

    def _tokens(self, limit: Any) -> int:
        cfg = self._engine.config
        return cfg.runaway_tokens if cfg.runaway_tokens is not None else int(limit or cfg.default_max_tokens)

    async def _run(self, work: Callable[[], Any]) -> web.StreamResponse:
        stats = self._engine.stats
        stats.running += 1
        try:
            response: web.StreamResponse = await work()
            stats.completed += 1
            return response
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        finally:
            stats.running -= 1

    async def _stream(self, request: web.Request, *, prompt: int, n: int, head: list[bytes],
                      delta: Callable[[int], bytes], tail: Callable[[], list[bytes]]) -> web.StreamResponse:
        """`head` events, then one delta per token (with the configured delays and faults), then `tail()`."""
        cfg, stats = self._engine.config, self._engine.stats
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if cfg.prefill_delay_s:
            await asyncio.sleep(cfg.prefill_delay_s)
        stats.prompt_tokens += prompt
        await response.write(b"".join(head))
        async for i in paced_tokens(request, cfg, n):
            stats.completion_tokens += 1  # generated, whether or not the client still reads it
            await response.write(delta(i))
        if dropped(request):
            return response
        await response.write(b"".join(tail()))
        await response.write_eof()
        return response

    async def _whole(self, *, prompt: int, n: int, answer: Callable[[], dict[str, Any]]) -> web.Response:
        cfg, stats = self._engine.config, self._engine.stats
        if cfg.prefill_delay_s:
            await asyncio.sleep(cfg.prefill_delay_s)
        stats.prompt_tokens += prompt
        stats.completion_tokens += n
        return _json(answer())

    def _usage(self, real: dict[str, Any]) -> Any:
        override = self._engine.config.usage_override
        return real if override is None else override

    # ---- /v1/responses -------------------------------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        from fleetgate.sim.fake_engine import prompt_tokens_of

        body, failed = await self._begin(request)
        if failed is not None:
            return failed
        prompt = prompt_tokens_of(responses_prompt(body), count=self._engine.config.prompt_count)
        n = self._tokens(body.get("max_output_tokens"))
        item_id = "msg_" + uuid.uuid4().hex
        base = {"id": "resp_" + uuid.uuid4().hex, "object": "response", "created_at": int(time.time()),
                "model": body.get("model"), "instructions": body.get("instructions"), "tools": body.get("tools") or [],
                "previous_response_id": body.get("previous_response_id"), "usage": None}

        def done() -> dict[str, Any]:
            text = "".join(f"t{i} " for i in range(n))
            item = {"id": item_id, "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
            usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n,
                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + n}
            # vLLM: "incomplete" when generation stopped at `max_output_tokens`, as the fake's always does
            return {**base, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                    "output": [item], "usage": self._usage(usage)}

        if not body.get("stream"):
            return await self._run(lambda: self._whole(prompt=prompt, n=n, answer=done))
        at = {"item_id": item_id, "output_index": 0, "content_index": 0}
        started = {**base, "status": "in_progress", "output": []}
        head = [_event("response.created", {"sequence_number": 0, "response": started}),
                _event("response.in_progress", {"sequence_number": 1, "response": started}),
                _event("response.output_item.added", {"sequence_number": 2, "output_index": 0, "item": {
                    "id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
                _event("response.content_part.added", {"sequence_number": 3, **at, "part": {
                    "type": "output_text", "text": "", "annotations": []}})]

        def delta(i: int) -> bytes:
            return _event("response.output_text.delta", {"sequence_number": 4 + i, **at, "delta": f"t{i} ",
                                                         "logprobs": []})

        def tail() -> list[bytes]:
            final = done()
            item = final["output"][0]
            part, seq = item["content"][0], 4 + n
            return [_event("response.output_text.done", {"sequence_number": seq, **at, "text": part["text"],
                                                         "logprobs": []}),
                    _event("response.content_part.done", {"sequence_number": seq + 1, **at, "part": part}),
                    _event("response.output_item.done", {"sequence_number": seq + 2, "output_index": 0, "item": item}),
                    _event("response.completed", {"sequence_number": seq + 3, "response": final})]

        return await self._run(lambda: self._stream(request, prompt=prompt, n=n, head=head, delta=delta, tail=tail))

    # ---- /v1/messages --------------------------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        from fleetgate.sim.fake_engine import prompt_tokens_of

        body, failed = await self._begin(request)
        if failed is not None:
            return failed
        prompt = prompt_tokens_of(messages_prompt(body), count=self._engine.config.prompt_count)
        n = self._tokens(body.get("max_tokens"))
        base = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": body.get("model")}

        def usage() -> Any:
            return self._usage({"input_tokens": prompt, "output_tokens": n})

        if not body.get("stream"):
            text = "".join(f"t{i} " for i in range(n))
            return await self._run(lambda: self._whole(prompt=prompt, n=n, answer=lambda: {
                **base, "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens",
                "stop_sequence": None, "usage": usage()}))
        head = [_event("message_start", {"message": {**base, "content": [], "stop_reason": None, "stop_sequence": None,
                                                     "usage": {"input_tokens": prompt, "output_tokens": 0}}}),
                _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]

        def delta(i: int) -> bytes:
            return _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"t{i} "}})

        def tail() -> list[bytes]:
            return [_event("content_block_stop", {"index": 0}),
                    _event("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                             "usage": usage()}),
                    _event("message_stop", {})]

        return await self._run(lambda: self._stream(request, prompt=prompt, n=n, head=head, delta=delta, tail=tail))

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """vLLM's `/v1/messages/count_tokens`: the prompt a Messages request would make the engine read."""
        from fleetgate.sim.fake_engine import prompt_tokens_of

        body = orjson.loads(await request.read())
        self._engine.stats.tokenized += 1
        count = prompt_tokens_of(messages_prompt(body), count=self._engine.config.prompt_count)
        return _json({"input_tokens": count, "context_management": {"original_input_tokens": count}})

    # ---- /v1/embeddings ------------------------------------------------------------------------------------

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        from fleetgate.sim.fake_engine import prompt_tokens_of

        body, failed = await self._begin(request)
        if failed is not None:
            return failed
        value = body.get("input")
        inputs = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value or [])
        counts = [len(v) if isinstance(v, list) else prompt_tokens_of({"prompt": v}) for v in inputs]
        prompt = sum(counts)
        data = [{"object": "embedding", "index": i, "embedding": [(c + k) / 100 for k in range(EMBEDDING_DIM)]}
                for i, c in enumerate(counts)]
        answer = {"id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
                  "model": body.get("model"), "data": data,
                  "usage": self._usage({"prompt_tokens": prompt, "total_tokens": prompt})}
        return await self._run(lambda: self._whole(prompt=prompt, n=0, answer=lambda: answer))
