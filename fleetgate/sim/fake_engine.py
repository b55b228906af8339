"""A fast in-process fake OpenAI engine (aiohttp.web) for tests and the gateway benchmark.

Not a simulation of an LLM: it answers `/v1/chat/completions` and `/v1/completions` in vLLM's
shapes with deterministic text (`"t0 t1 ..."`, one token per chunk, `max_tokens` tokens, default
16, `n` choices) and exact usage (`prompt_tokens_of`: the words, or with `prompt_count="bytes"` the UTF-8
bytes, of every content kind a chat template renders), including vLLM's
`stream_options.continuous_usage_stats`; `/v1/responses`, `/v1/messages` and `/v1/embeddings` alike
(`fake_api_routes`). It can be slow (prefill and inter-token delays), fail
(an HTTP status), drop the connection or go silent mid-stream, stream past `max_tokens`
(`runaway_tokens`), and it records what it received and how many streams were cancelled by the client.
`/health`, `/v1/models`, `/metrics` (a few vLLM metric names) and vLLM's `/tokenize` are served too. With
`kv_events` set it keeps a fake prefix cache and publishes it as vLLM KV events over ZMQ
(`fleetgate.sim.fake_kv_cache`).

Standalone: `python -m fleetgate.sim.fake_engine --port 8100 [--model NAME] [--itl-ms 1]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from fleetgate.sim.fake_api_routes import FakeApiRoutes, dropped, paced_tokens
from fleetgate.sim.fake_kv_cache import FakePrefixCache, word_tokens
from fleetgate.sim.kv_publisher import FakeKvPublisher
from fleetgate.sim.openai_fields import requested_max_tokens


@dataclass(slots=True)
class FakeEngineConfig:
    model: str = "fake-model"
    prefill_delay_s: float = 0.0  # before the first token (and before a non-streaming answer)
    inter_token_delay_s: float = 0.0  # between stream chunks
    # Tokens on a shared step clock (multiples of inter_token_delay_s) rather than each stream's own: every stream
    # gets its next token at the same instant, as in a GPU engine's batched decode step, so a gateway in front
    # receives a burst of one chunk per stream every step instead of chunks spread evenly.
    step_sync: bool = False
    default_max_tokens: int = 16
    fail_status: int | None = None  # answer every completion with this status
    fail_message: str = "fake engine failure"
    drop_after_chunks: int | None = None  # close the connection after this many content chunks
    hang_after_chunks: int | None = None  # go silent (connection open) after this many content chunks
    garbage: bool = False  # answer 200 with a body that is not an OpenAI response
    usage_override: Any = None  # when set, sent as `usage` instead of the real one (malformed-usage tests)
    max_running: int | None = None  # a batch this big: requests beyond it are reported as waiting in /metrics
    prompt_count: str = "words"  # how prompts are tokenized: "words", or "bytes" (the worst tokenizer)
    runaway_tokens: int | None = None  # generate this many tokens whatever max_tokens says (a broken engine)
    # KV-cache events (precise prefix routing): a ZMQ address to publish on (tcp://127.0.0.1:port, ipc://path),
    # its replay address, and the fake prefix cache's block size and capacity (`fleetgate.sim.fake_kv_cache`).
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_block_size: int = 4
    kv_capacity_blocks: int = 1024


@dataclass(slots=True)
class Received:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)
class FakeEngineStats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    running: int = 0
    # What the engine processed, the truth a charge is compared with: a prompt once its prefill is done,
    # a completion token once it was handed to the connection.
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokenized: int = 0  # `/tokenize` calls
    received: deque[Received] = field(default_factory=lambda: deque(maxlen=1000))


MEDIA_PAYLOADS = ("image_url", "input_audio", "video_url", "audio_url")  # placeholders, not text
MEDIA_TOKENS = 64  # what one media item costs (a fixed number of placeholder tokens, as vision models do)


def _strings(value: Any) -> list[str]:
    """Every string an engine's template could render from `value` (a content part's `type` is markup)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _strings(v)]
    if isinstance(value, dict):
        if value.get("type") in MEDIA_PAYLOADS:
            return []
        return [t for k, v in value.items() if k != "type" for t in _strings(v)]
    return []


def _media(value: Any) -> int:
    if isinstance(value, list):
        return sum(_media(v) for v in value)
    if isinstance(value, dict):
        return 1 if value.get("type") in MEDIA_PAYLOADS else sum(_media(v) for v in value.values())
    return 0


def prompt_tokens_of(body: dict[str, Any], *, count: str = "words") -> int:
    """The prompt tokens the fake engine reads: every content kind of every message (text, thinking and
    refusal parts, names, reasoning, tool calls, tool results), the tool definitions, and a fixed number per
    media item. `count`: "words" (whitespace-separated words: one token each) or "bytes" (one token per UTF-8
    byte: the most any real tokenizer makes of a text, for hostile-input tests)."""
    if "messages" in body:
        texts = [t for m in body.get("messages") or [] if isinstance(m, dict)
                 for k, v in m.items() if k != "role" for t in _strings(v)]
        texts += _strings(body.get("tools"))
        media = _media(body.get("messages"))
    else:
        texts, media = _strings(body.get("prompt")), 0
    size = (lambda t: len(t.encode())) if count == "bytes" else (lambda t: len(t.split()))
    return sum(size(t) for t in texts) + media * MEDIA_TOKENS


class FakeEngine:
    def __init__(self, config: FakeEngineConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or FakeEngineConfig()
        self.stats = FakeEngineStats()
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self.kv_cache: FakePrefixCache | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def received(self) -> deque[Received]:
        return self.stats.received

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        FakeApiRoutes(self).install(app)  # /v1/responses, /v1/messages, /v1/embeddings
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        return app

    async def start(self) -> FakeEngine:
        # handler_cancellation: a client that leaves cancels the handler, as in vLLM (request aborted).
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])
        cfg = self.config
        if cfg.kv_events is not None:
            publisher = await FakeKvPublisher(publisher=cfg.kv_events, replay=cfg.kv_replay).start()
            self.kv_cache = FakePrefixCache(publisher=publisher, block_size=cfg.kv_block_size,
                                            capacity_blocks=cfg.kv_capacity_blocks)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.kv_cache is not None:
            await self.kv_cache.publisher.stop()
            self.kv_cache = None

    # ---- handlers ---------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": "fake"}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        m = self.config.model
        cap = self.config.max_running
        running = self.stats.running if cap is None else min(cap, self.stats.running)
        cache = self.kv_cache
        lines = [
            f'vllm:num_requests_running{{model_name="{m}"}} {running}',
            f'vllm:num_requests_waiting{{model_name="{m}"}} {self.stats.running - running}',
            f'vllm:kv_cache_usage_perc{{model_name="{m}"}} 0.0',
            f'vllm:prefix_cache_queries_total{{model_name="{m}"}} {cache.queries if cache else 0}',
            f'vllm:prefix_cache_hits_total{{model_name="{m}"}} {cache.hits if cache else 0}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/tokenize`: `count` is the prompt tokens a chat or completion request would be charged
        (`prompt_tokens_of`, as its usage says); `tokens` are the fake tokenizer's ids of its text
        (`word_tokens`, what the fake prefix cache holds), for precise prefix routing. With
        `prompt_count="bytes"` the two differ: routing reads the ids, the reservation the count."""
        if self.config.fail_status is not None:  # a failing engine fails this too
            return web.Response(status=self.config.fail_status, text=self.config.fail_message)
        body = orjson.loads(await request.read())
        self.stats.tokenized += 1
        count = prompt_tokens_of(body, count=self.config.prompt_count)
        answer = {"count": count, "max_model_len": 1_000_000, "tokens": word_tokens(body)}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        raw = await request.read()
        body = orjson.loads(raw)
        self.stats.requests += 1
        self.stats.received.append(Received(request.path, body, {k.lower(): v for k, v in request.headers.items()}))
        if cfg.fail_status is not None:
            error = {"error": {"message": cfg.fail_message, "type": "BadRequestError" if cfg.fail_status < 500
                               else "InternalServerError", "param": None, "code": cfg.fail_status}}
            return web.Response(status=cfg.fail_status, body=orjson.dumps(error), content_type="application/json")
        if cfg.garbage:
            return web.Response(body=b"<html>oops</html>", content_type="text/html")
        chat = request.path.endswith("/chat/completions")
        n = int(requested_max_tokens(body, chat=chat) or cfg.default_max_tokens)
        if cfg.runaway_tokens is not None:
            n = cfg.runaway_tokens
        prompt = body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) else 1
        choices = int(body.get("n") or 1) * prompts  # vLLM: n completions for each prompt of a list
        usage = {"prompt_tokens": prompt_tokens_of(body, count=cfg.prompt_count), "completion_tokens": n * choices}
        usage["total_tokens"] = usage["prompt_tokens"] + n * choices
        self.stats.running += 1
        try:
            if self.kv_cache is not None:
                await self.kv_cache.admit(word_tokens(body))
            if body.get("stream"):
                response = await self._stream(request, body, chat=chat, n=n, usage=usage)
            else:
                if cfg.prefill_delay_s:
                    await asyncio.sleep(cfg.prefill_delay_s)
                response = self._complete(body, chat=chat, n=n, usage=usage)
                self.stats.prompt_tokens += usage["prompt_tokens"]
                self.stats.completion_tokens += usage["completion_tokens"]
            self.stats.completed += 1
            return response
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        finally:
            self.stats.running -= 1

    def _complete(self, body: dict[str, Any], *, chat: bool, n: int, usage: dict[str, int]) -> web.Response:
        text = "".join(f"t{i} " for i in range(n))
        created = int(time.time())
        count = usage["completion_tokens"] // max(n, 1) if n else 1
        if chat:
            choices: list[dict[str, Any]] = [{"index": k, "message": {"role": "assistant", "content": text},
                                              "logprobs": None, "finish_reason": "length"} for k in range(count)]
            obj = {"id": "chatcmpl-fake", "object": "chat.completion", "created": created}
        else:
            choices = [{"index": k, "text": text, "logprobs": None, "finish_reason": "length"} for k in range(count)]
            obj = {"id": "cmpl-fake", "object": "text_completion", "created": created}
        reported = usage if self.config.usage_override is None else self.config.usage_override
        obj.update({"model": body.get("model"), "choices": choices, "usage": reported})
        return web.Response(body=orjson.dumps(obj), content_type="application/json")

    async def _stream(
        self, request: web.Request, body: dict[str, Any], *, chat: bool, n: int, usage: dict[str, int]
    ) -> web.StreamResponse:
        cfg = self.config
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": "chatcmpl-fake" if chat else "cmpl-fake",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model")}
        prompt = usage["prompt_tokens"]
        count = usage["completion_tokens"] // max(n, 1) if n else 1
        override = cfg.usage_override

        def event(choice: dict[str, Any], done: int) -> bytes:
            obj = {**base, "choices": [choice]}
            if continuous:
                obj["usage"] = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
                if override is not None:
                    obj["usage"] = override
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        if cfg.prefill_delay_s:
            await asyncio.sleep(cfg.prefill_delay_s)
        self.stats.prompt_tokens += prompt
        if chat:
            await response.write(event({"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}, 0))
        async for i in paced_tokens(request, cfg, n):
            finish = "length" if i == n - 1 else None
            for k in range(count):
                choice = ({"index": k, "delta": {"content": f"t{i} "}, "logprobs": None, "finish_reason": finish}
                          if chat else {"index": k, "text": f"t{i} ", "logprobs": None, "finish_reason": finish})
                self.stats.completion_tokens += 1  # generated, whether or not the client still reads it
                await response.write(event(choice, i * count + k + 1))
        if dropped(request):
            return response
        if include_usage:
            final = usage if override is None else override
            await response.write(b"data: " + orjson.dumps({**base, "choices": [], "usage": final}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetgate.sim.fake_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--prefill-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0, help="inter-token delay")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens when the request sets none")
    parser.add_argument("--step-sync", action="store_true",
                        help="every stream's tokens on one step clock (bursts, as a GPU engine's batched steps)")
    args = parser.parse_args(argv)
    config = FakeEngineConfig(model=args.model, prefill_delay_s=args.prefill_ms / 1000,
                              inter_token_delay_s=args.itl_ms / 1000, default_max_tokens=args.max_tokens,
                              step_sync=args.step_sync)
    engine = FakeEngine(config, host=args.host, port=args.port)
    import uvloop

    web.run_app(engine.app(), host=args.host, port=args.port, access_log=None, print=None,
                handler_cancellation=True, loop=uvloop.new_event_loop())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
