"""The token ids of a request's prompt, as the engine will see them: the request side of precise prefix routing.

The engine caches the tokens of the prompt it builds: for a chat request, the model's chat template
applied to the messages (plus its options), then tokenized. To compare a request with the blocks an
engine holds, the gateway needs those same tokens. Two ways, chosen by the scorer's `tokenizer`:

- `engine` (default): ask vLLM's own `POST /tokenize` on one of the candidate engines (the least
  loaded), with the request's messages or prompt and the options that change the prompt
  (`add_generation_prompt`, `continue_final_message`, `add_special_tokens`, `chat_template`,
  `chat_template_kwargs`, `tools`, `mm_processor_kwargs`). Exact by construction (same template
  code, same tokenizer, same model revision as the engine that caches the blocks), nothing to install
  or keep in sync in the gateway; it costs one loopback/pod-network round trip (~1.5-3 ms on a vLLM CPU
  engine) before the decision, and some CPU in the engine's API server.
- `local`: the model's Hugging Face tokenizer in the gateway process (`transformers`, loaded in a thread
  at start-up, or on a model's first request, from `tokenizerPaths[model]` or `tokenizerPaths["*"]`, a
  directory with `tokenizer.json` and its chat template; requests meanwhile route on the approximate index): no
  round trip, but the gateway needs the tokenizer files and transformers, and a template that renders
  differently from vLLM's (content-part handling, tools) silently costs matches (never correctness: a
  prompt that matches nothing scores like a cold one). The rendered text is encoded segment-wise
  (`fleetgate.router.segment_tokens`): chunks cut at the tokenizer's added tokens, the repeated ones (a
  shared system prompt) read from a per-model cache (`segment_entries`, `segment_bytes`: the scorer's
  `tokenizeSegmentCacheMiB`, 64), the same ids as a full encode; ~0.3-0.5 ms instead of ~4 ms of CPU for a
  2,800-token shared-prefix prompt on the 2-core dev box. A tokenizer for which that could differ (checked
  at load against the full encode) is encoded whole, with a warning. What is left to encode (the unique part, a
  new system prompt) is encoded on the event loop by default; with `thread_min_chars` set (the scorer's
  `tokenizeThreadMinChars`, opt-in) it goes, from that many characters on, to a worker thread in one
  `encode_batch_fast` call, which releases the GIL, so the loop keeps relaying streams meanwhile (`encode`
  holds the GIL, so a thread did not help it); on the GPUs that gave worse routing (`THREAD_MIN_CHARS`). The
  chat template is rendered, and the cache read and filled, on the loop.

Both keep an LRU cache keyed by (model, canonical JSON of what is tokenized), so a retried or repeated
request is not tokenized twice. A completions prompt given as token ids needs no tokenizer. A request
that cannot be tokenized (batch prompts, an engine error or timeout, no tokenizer for the model) gets
None: the scorer then uses the approximate, text-based index for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import xxhash

from fleetgate.core.types import Endpoint
from fleetgate.router.segment_tokens import Plan, SegmentedEncoder, build_segmented_encoder, encode_texts
from fleetgate.router.types import RoutingRequest

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)
ANY_MODEL = "*"
# Texts to encode from this many characters on would go to a worker thread; None: every encode on the event
# loop, the default since the GPU A/B (docs/reports/gpu-routing.md, run 7b): at 1.5x load on 2 H200s the thread
# gave a worse TTFT p90 than the loop in 3 samples of 3 (4.81/3.42/3.26 s against 3.01/3.16/3.03 s) and fewer
# prefix-cache hits in 2, although it halves the loop thread's CPU per request on the dev box.
THREAD_MIN_CHARS: int | None = None
THREADS = 2  # worker threads per tokenizer: a long unique prompt does not hold up the next request's encode
CHAT_OPTIONS = ("add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                "chat_template_kwargs", "tools", "mm_processor_kwargs")


class PromptTokenizer(Protocol):
    async def tokens(self, req: RoutingRequest, endpoints: Sequence[Endpoint]) -> list[int] | None: ...

    async def warm(self, timeout_s: float) -> None:
        """Load what the first request would otherwise wait for, up to `timeout_s` (at start-up, before the gateway
        reports ready)."""
        ...

    async def aclose(self) -> None: ...


def tokenize_request(req: RoutingRequest, *, model: str) -> dict[str, Any] | list[int] | None:
    """The `/tokenize` body for the request (or its prompt's token ids as given); None when it has none."""
    body = req.body
    if body is None:
        return None
    if req.kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        out: dict[str, Any] = {"model": model, "messages": messages}
        out.update({k: body[k] for k in CHAT_OPTIONS if body.get(k) is not None})
        return out
    if req.kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None  # batch prompts: several prompts, no single prefix to route on
        out = {"model": model, "prompt": prompt}
        if body.get("add_special_tokens") is not None:
            out["add_special_tokens"] = body["add_special_tokens"]
        return out
    return None


class _Lru:
    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._data: OrderedDict[int, list[int]] = OrderedDict()

    @staticmethod
    def key(body: Mapping[str, Any]) -> int:
        return xxhash.xxh3_64_intdigest(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))

    def get(self, key: int) -> list[int] | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: int, value: list[int]) -> None:
        self._data[key] = value
        if len(self._data) > self.entries:
            self._data.popitem(last=False)


class _CachedTokenizer:
    """What both tokenizers share: the request's body, the LRU cache, the failure count."""

    def __init__(self, *, cache_entries: int) -> None:
        self.cache = _Lru(cache_entries)
        self.failures = 0

    def _model(self, req: RoutingRequest, endpoints: Sequence[Endpoint]) -> str:
        return req.model

    async def tokens(self, req: RoutingRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        if not endpoints:
            return None
        body = tokenize_request(req, model=self._model(req, endpoints))
        if body is None or isinstance(body, list):
            return body
        key = self.cache.key(body)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        tokens = await self._tokenize(body, req, endpoints)
        if tokens is None:
            self.failures += 1
        else:
            self.cache.put(key, tokens)
        return tokens

    async def _tokenize(self, body: dict[str, Any], req: RoutingRequest, endpoints: Sequence[Endpoint]
                        ) -> list[int] | None:
        raise NotImplementedError

    async def warm(self, timeout_s: float) -> None:
        return None


class EngineTokenizer(_CachedTokenizer):
    """Tokens from vLLM's `/tokenize` on the endpoint `choose` picks among the candidates."""

    def __init__(self, *, choose: Callable[[Sequence[Endpoint]], Endpoint], timeout_s: float = 0.5,
                 cache_entries: int = 4096) -> None:
        super().__init__(cache_entries=cache_entries)
        self.choose = choose
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _model(self, req: RoutingRequest, endpoints: Sequence[Endpoint]) -> str:
        return endpoints[0].model  # the engine's own name for the base model; an adapter shares its tokenizer

    async def _tokenize(self, body: dict[str, Any], req: RoutingRequest, endpoints: Sequence[Endpoint]
                        ) -> list[int] | None:
        import aiohttp

        endpoint = self.choose(endpoints)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.post(f"{endpoint.url}/tokenize", data=orjson.dumps(body),
                                          headers={"Content-Type": "application/json"}) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}: {raw[:200]!r}")
            tokens = orjson.loads(raw).get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ValueError("no token list in the answer")
        except (TimeoutError, OSError, ValueError, AttributeError, aiohttp.ClientError) as exc:
            log.debug("tokenize failed; routing on the approximate index",
                      extra={"endpoint": endpoint.id, "error": str(exc)})
            return None
        return tokens

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LocalTokenizer(_CachedTokenizer):
    """Tokens from the model's Hugging Face tokenizer in this process, loaded on first use per model."""

    def __init__(self, *, paths: Mapping[str, str], cache_entries: int = 4096, segment_entries: int = 16384,
                 segment_bytes: int = 64 << 20, thread_min_chars: int | None = THREAD_MIN_CHARS,
                 timeout_s: float | None = 0.5) -> None:
        if thread_min_chars is not None and thread_min_chars < 0:
            raise ValueError("tokenizeThreadMinChars must be 0 or positive (or null: encode on the event loop)")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("tokenizeTimeoutS must be positive (or null: no bound)")
        super().__init__(cache_entries=cache_entries)
        self.paths = dict(paths)
        self.segment_entries = segment_entries  # per model; 0 disables the segment-wise encode
        self.segment_bytes = segment_bytes
        self.thread_min_chars = thread_min_chars  # None: every encode on the loop
        self.timeout_s = timeout_s  # a request waits this long for the thread, then routes approximately
        self.encodes = {"thread": 0, "loop": 0}  # encodes that had text to encode, by where they ran
        self._loaded: dict[str, Loaded] = {}
        self._loading: dict[str, asyncio.Task[Loaded]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def preload(self) -> None:
        """Start loading every configured tokenizer in a thread; requests meanwhile route approximately."""
        for model in list(self.paths):
            self._tokenizer(model)

    async def warm(self, timeout_s: float) -> None:
        """Load every configured tokenizer before the gateway serves (bounded by `timeout_s`; past it, requests
        route on the approximate index until it is done). Why not in the background while serving: loading holds
        the GIL for seconds (the `transformers` import, the tokenizer build), which stalls every request and
        stream the gateway is relaying; on 2 H100s a precise profile whose tokenizer loaded during the first
        seconds of traffic measured 21-24 ms of gateway CPU per request (docs/reports/gpu-routing.md)."""
        self.preload()
        pending = [t for t in self._loading.values() if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            if late:
                log.warning("tokenizers still loading after the start-up wait; routing is approximate until then",
                            extra={"timeout_s": timeout_s, "loading": len(late)})
        self.preload()  # moves what finished into `_loaded` (and logs a failed load once)

    def loaded(self, model: str) -> bool:
        """Whether `model`'s tokenizer is ready (False while it loads, and after it failed to)."""
        return self._tokenizer(model) is not None

    def _tokenizer(self, model: str) -> Loaded | None:
        """The model's tokenizer once loaded; None while it loads (in a thread, started here on first use: the
        requests meanwhile route on the approximate index rather than wait seconds) or when it cannot load."""
        model = model if model in self.paths else ANY_MODEL  # `*`: one tokenizer for every model
        loaded = self._loaded.get(model)
        if loaded is not None:
            return loaded
        path = self.paths.get(model)
        if path is None:
            return None
        task = self._loading.get(model)
        if task is None:
            self._loading[model] = asyncio.create_task(asyncio.to_thread(
                load, path, segment_entries=self.segment_entries, segment_bytes=self.segment_bytes))
            return None
        if not task.done():
            return None
        if task.cancelled() or task.exception() is not None:
            log.warning("loading the tokenizer failed", exc_info=task.exception() if not task.cancelled() else None,
                        extra={"model": model, "path": path})
            self.paths.pop(model)  # do not retry on every request: it would fail the same way
            return None
        loaded = self._loaded[model] = task.result()
        return loaded

    async def _tokenize(self, body: dict[str, Any], req: RoutingRequest, endpoints: Sequence[Endpoint]
                        ) -> list[int] | None:
        loaded = self._tokenizer(req.model)
        if loaded is None:
            return None
        try:
            text, special = _render(loaded.tok, body)
            plan = _plan(loaded, text, special)
            if plan is None:  # no fast tokenizer to batch-encode with: its own call, on the loop
                return _ids(loaded.tok, text, add_special_tokens=special, segments=loaded.segments)
            return plan.assemble(await self._encode_texts(loaded, plan))
        except Exception as exc:  # a template that rejects the messages: the engine will say so to the client
            log.debug("local tokenization failed", extra={"model": req.model, "error": str(exc)})
            return None

    async def _encode_texts(self, loaded: Loaded, plan: Plan) -> list[list[int]]:
        """The plan's texts encoded: in a worker thread when there are `thread_min_chars` or more of them. The
        Rust encode releases the GIL (`encode_texts`), so the loop keeps relaying streams and routing meanwhile;
        below the threshold the thread's hand-offs cost more loop time than the encode (~40 us against ~65 us
        for 512 characters of Gemma 3 on the dev box). The cache and the plan stay on the loop: the thread
        touches only the tokenizer, which needs no lock. Waiting for the thread adds to this request's decision
        up to a GIL switch interval (5 ms) per hand-off while the loop is busy, and nothing to the others'."""
        if not plan.texts:
            return []
        if self.thread_min_chars is None or plan.chars < self.thread_min_chars:
            self.encodes["loop"] += 1
            return encode_texts(loaded.backend, plan.texts, plan.special)
        self.encodes["thread"] += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="fleetgate-tokenize")
        loop = asyncio.get_running_loop()
        # Bounded: behind a flood of huge prompts a request waits `timeout_s` at most, then routes on the approximate
        # index (TimeoutError: a failure); a job abandoned before it started is dropped from the queue.
        job = loop.run_in_executor(self._pool, encode_texts, loaded.backend, plan.texts, plan.special)
        return await asyncio.wait_for(job, self.timeout_s)

    async def aclose(self) -> None:
        for task in self._loading.values():
            task.cancel()
        self._loading.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A model's tokenizer and, where exact for it, its segment-wise encoder (`fleetgate.router.segment_tokens`)."""

    tok: Any
    segments: SegmentedEncoder | None
    backend: Any = None  # the fast tokenizer, where its `encode_batch_fast` gives `encode`'s ids (no truncation
    # or padding); None: encode through `tok`'s own call


def load(path: str, *, segment_entries: int, segment_bytes: int) -> Loaded:
    """Load the tokenizer and build its segment-wise encoder (checked against the full encode; seconds: in a thread)."""
    tok = _load_tokenizer(path)
    backend = getattr(tok, "backend_tokenizer", None)
    segments = None
    if backend is not None and segment_entries > 0 and segment_bytes > 0:
        segments = build_segmented_encoder(backend, max_entries=segment_entries, max_bytes=segment_bytes,
                                           probes=_template_probes(tok))
    batchable = (backend is not None and hasattr(backend, "encode_batch_fast") and backend.truncation is None
                 and backend.padding is None)
    return Loaded(tok=tok, segments=segments, backend=backend if batchable else None)


def _template_probes(tok: Any) -> list[str]:
    """The model's own rendered chat prompts, special-token text in the user's message included."""
    messages = [{"role": "system", "content": "Be brief. " * 20}, {"role": "user", "content": " Hi <bos>\n\n  "}]
    try:
        return [str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))]
    except Exception:  # no template, or one that wants other roles: the generic probes still run
        return []


def _encode(tok: Any, body: Mapping[str, Any], segments: SegmentedEncoder | None = None) -> list[int]:
    """As vLLM does: render the chat template to text, then tokenize without adding special tokens again."""
    text, special = _render(tok, body)
    return _ids(tok, text, add_special_tokens=special, segments=segments)


def _render(tok: Any, body: Mapping[str, Any]) -> tuple[str, bool]:
    """The text vLLM tokenizes for `body` (a chat's rendered template, or the prompt) and whether the
    tokenizer's special tokens are added to it."""
    if "messages" in body:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        text = tok.apply_chat_template(
            body["messages"], tokenize=False, chat_template=body.get("chat_template"), tools=body.get("tools"),
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False), **kwargs,
        )
        return text, bool(body.get("add_special_tokens", False))
    return body["prompt"], bool(body.get("add_special_tokens", True))


def _plan(loaded: Loaded, text: str, special: bool) -> Plan | None:
    """The segment-wise plan, else a whole-text one; None when only `tok`'s own call can encode it."""
    if loaded.backend is None:
        return None
    plan = loaded.segments.plan(text, add_special_tokens=special) if loaded.segments is not None else None
    if plan is None and loaded.backend is not None:
        plan = Plan.whole(text, special)
    return plan


def _ids(tok: Any, text: str, *, add_special_tokens: bool, segments: SegmentedEncoder | None = None) -> list[int]:
    """Segment-wise when an encoder is given (the same ids, the shared pieces from its cache); else one sequence
    through the fast tokenizer's own `encode` (`tok(text)` goes through transformers' batch encoding for a batch
    of one: ~10% more CPU here); the same ids either way (tests/e2e/test_real_engine.py)."""
    if segments is not None:
        ids = segments.encode(text, add_special_tokens=add_special_tokens)
        if ids is not None:
            return ids
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=add_special_tokens).ids)
    return [int(t) for t in tok(text, add_special_tokens=add_special_tokens)["input_ids"]]
