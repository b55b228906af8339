"""End to end: the gateway in front of a real vLLM CPU engine serving the prepared Gemma 3 270M.

One engine and one in-process gateway for the whole module (an engine takes about a minute to
start); the engine publishes its KV-cache events (ipc sockets), which the precise prefix routing test reads
through a second in-process gateway. The model directory is prepared on first use into the normal cache
(`$FLEETGATE_CACHE` or `~/.cache/fleetgate`), exactly as `fleetgate up` does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetgate.core.types import Endpoint
from fleetgate.gateway.settings import GatewaySettings, KvEventsRoute, ModelRoute, ServerSettings
from fleetgate.local.config import EngineConfig
from fleetgate.local.engines import EngineFleet
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.vllm_command import vllm_specs
from fleetgate.router.config import precise_prefix_config
from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.plugins.precise_prefix_scorer import PrecisePrefixScorer
from fleetgate.router.prompt_tokens import EngineTokenizer, LocalTokenizer
from fleetgate.router.types import RoutingRequest
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

from .gateway_thread import serving
from .http_json import post_json_headers, request_json

pytestmark = pytest.mark.real_engine

MODEL = "gemma-3-270m"
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Stack:
    gateway: str
    engine: str
    kv_publisher: str  # the engine publishes its KV-cache events here (ipc), for the precise routing test
    kv_replay: str
    model_path: Path


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    model_path = prepare_model()
    logs = tmp_path_factory.mktemp("engine-logs")
    # KV events on: the precise routing test below reads them; the other tests do not notice them.
    config = EngineConfig(base_port=0, max_model_len=MAX_MODEL_LEN, max_num_seqs=4, log_dir=logs, kv_events=True)
    specs = vllm_specs(config=config, model_path=model_path)
    fleet = EngineFleet(specs=specs, startup_timeout_s=900)
    with fleet:
        fleet.start()
        settings = GatewaySettings(
            server=ServerSettings(log_requests=False, auth="open"),
            models=[ModelRoute(name=MODEL, endpoints=fleet.urls)],
        )
        with serving(settings) as (url, _server):
            assert specs[0].kv_publisher is not None and specs[0].kv_replay is not None
            yield Stack(gateway=url, engine=fleet.urls[0], kv_publisher=specs[0].kv_publisher,
                        kv_replay=specs[0].kv_replay, model_path=model_path)


def test_chat_completion_answers_with_real_text(stack: Stack) -> None:
    status, body = request_json(
        f"{stack.gateway}/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_tokens": 24, "temperature": 0},
    )
    assert status == 200, body
    answer = body["choices"][0]["message"]["content"]
    # A correctly prepared model (weights, BOS, template, end tokens) answers this; a broken one babbles.
    assert "Paris" in answer, answer
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 5 and 0 < usage["completion_tokens"] < 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_streamed_completion_reports_usage(stack: Stack) -> None:
    # ignore_eos (a vLLM extension the gateway passes through): exactly max_tokens tokens, so usage is known.
    body = {"model": MODEL, "prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{stack.gateway}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    events: list[str] = []
    arrivals: list[float] = []
    with urllib.request.urlopen(req, timeout=300) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                arrivals.append(time.monotonic())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert text.strip(), chunks
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 12
    assert sum(1 for c in chunks if c["choices"]) >= 6, "tokens must arrive as separate events"
    # Relayed as generated: a buffering proxy would deliver the events back to back (gaps of microseconds).
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(1 for g in gaps if g > 0.002) >= 5, f"events arrived bunched together: gaps {gaps}"


def test_unknown_model_is_an_openai_shaped_404(stack: Stack) -> None:
    status, body = request_json(
        f"{stack.gateway}/v1/chat/completions",
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 404
    assert set(body["error"]) >= {"message", "type", "code"}
    assert "no-such-model" in body["error"]["message"]


def test_prompt_over_max_model_len_is_the_engines_400_relayed(stack: Stack) -> None:
    long_prompt = "one two three four five six seven eight nine ten " * 80  # ~800 tokens > 512
    status, body = request_json(
        f"{stack.gateway}/v1/completions", {"model": MODEL, "prompt": long_prompt, "max_tokens": 8}
    )
    assert status == 400, body
    assert body["error"]["type"] in {"invalid_request_error", "BadRequestError"}
    assert re.search(r"context length|maximum|too long|max_model_len", body["error"]["message"], re.I), body


def _counter(metrics: str, name: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_prefix_cache_hits_on_a_repeated_prompt(stack: Stack) -> None:
    # vLLM CPU caches whole blocks of 128 tokens: the shared part must span at least one (~360 tokens here).
    prompt = "You are a helpful assistant for a bakery. " * 40 + "Question: what time do you open?"
    before = _counter(_text(f"{stack.engine}/metrics"), "vllm:prefix_cache_hits_total")
    for _ in range(2):
        status, _body = request_json(f"{stack.gateway}/v1/completions",
                                     {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert status == 200
    metrics = _text(f"{stack.engine}/metrics")
    after = _counter(metrics, "vllm:prefix_cache_hits_total")
    assert _counter(metrics, "vllm:prefix_cache_queries_total") > after
    assert after - before >= 128, f"prefix cache hits went {before} -> {after}"


# Issue 26: Gemma's own (prepared) template renders text parts only; vLLM turns `thinking` and `refusal` parts
# into text parts first, so the engine reads them like text. The bound must cover each kind it reads (the
# kinds this template does not render are checked with a template that renders everything in
# test_real_engine_budgets.py).
GEMMA_KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "text": ("chat", {"messages": [{"role": "user", "content": "one two three four five " * 40}]}),
    "thinking part": ("chat", {"messages": [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "one two three four five " * 40}]},
        {"role": "user", "content": "go on"}]}),
    "refusal part": ("chat", {"messages": [
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "one two three four five " * 40}]},
        {"role": "user", "content": "why"}]}),
    "odd unicode": ("chat", {"messages": [{"role": "user", "content": "\U0001f9ea" * 100}]}),  # 4 tokens each
    "tool message": ("chat", {"messages": [{"role": "user", "content": "hi"},
                                           {"role": "tool", "tool_call_id": "c", "content": "a b c d " * 40}]}),
    "prompt list": ("completions", {"prompt": ["one two three " * 20, "\U0001f9ea" * 50]}),
    "token ids": ("completions", {"prompt": [[2, 651, 6037, 2967] * 20, [2, 9259] * 10]}),
}


@pytest.mark.parametrize("kind", list(GEMMA_KINDS))
def test_the_prompt_bound_covers_what_gemmas_template_reads(stack: Stack, kind: str) -> None:
    from fleetgate.gateway.estimate import estimate_request
    from fleetgate.gateway.parsing import parse_request

    path, extra = GEMMA_KINDS[kind]
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0, **extra}
    status, answer = request_json(f"{stack.gateway}/v1/{'chat/' if path == 'chat' else ''}completions", body)
    assert status == 200, answer
    read = answer["usage"]["prompt_tokens"]
    bound = estimate_request(parse_request(path, json.dumps(body).encode()),  # type: ignore[arg-type]
                             context=MAX_MODEL_LEN).prompt_tokens
    assert read <= bound, (kind, read, bound)
    if kind == "thinking part":  # the engine reads it (the old estimate ignored it): about as many as text
        text = dict(GEMMA_KINDS["text"][1])
        _, plain = request_json(f"{stack.gateway}/v1/chat/completions", {**body, **text})
        assert read >= plain["usage"]["prompt_tokens"] - 5


def _usage_totals(gateway: str) -> tuple[int, int]:
    status, body = request_json(f"{gateway}/v1/usage")  # auth open: the caller reads everyone's usage
    assert status == 200, body
    return int(body["totals"]["prompt_tokens"]), int(body["totals"]["completion_tokens"])


def _engine_tokens(engine: str) -> tuple[float, float, float]:
    metrics = _text(f"{engine}/metrics")
    return (_counter(metrics, "vllm:prompt_tokens_total"), _counter(metrics, "vllm:generation_tokens_total"),
            _counter(metrics, "vllm:num_requests_running") + _counter(metrics, "vllm:num_requests_waiting"))


def _stream_and_leave(gateway: str, *, prompt: str, leave_after: int | None) -> int:
    """Stream a completion through the gateway; close the connection after `leave_after` text chunks."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(f"{gateway}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    got = 0
    with urllib.request.urlopen(req, timeout=300) as response:
        for raw in response:
            if raw.startswith(b"data: {") and b'"text"' in raw:
                got += 1
                if leave_after is not None and got >= leave_after:
                    break  # leaving the `with` closes the connection mid-stream
    return got


def test_tenants_are_charged_what_the_engine_counted_with_clients_leaving_mid_stream(stack: Stack) -> None:
    prompt_before, completion_before = _usage_totals(stack.gateway)
    engine_before = _engine_tokens(stack.engine)
    for i, leave in enumerate((3, None, 1, 7, None, 12)):
        got = _stream_and_leave(stack.gateway, prompt=f"Request {i}: the three primary colours are", leave_after=leave)
        assert got == (leave or 40)
    deadline = time.monotonic() + 60
    while _engine_tokens(stack.engine)[2] > 0 and time.monotonic() < deadline:  # the aborts have landed
        time.sleep(0.2)
    time.sleep(2.5)  # the gateway's drain of the cancelled streams (cancel_drain_s) and its ledger
    engine_after = _engine_tokens(stack.engine)
    prompt_after, completion_after = _usage_totals(stack.gateway)
    assert engine_after[1] - engine_before[1] >= 2 * 40 + 3 + 1 + 7 + 12
    assert (prompt_after - prompt_before, completion_after - completion_before) == (
        engine_after[0] - engine_before[0], engine_after[1] - engine_before[1])


async def test_real_envoy_and_the_endpoint_picker_serve_the_real_engine(stack: Stack) -> None:
    """The other front door on the same engine: a real Envoy asks `fleetgate epp` (ext_proc), which routes to the
    real vLLM CPU engine, rewrites the answer as the gateway does and charges the engine's own usage."""
    import datetime as dt
    from collections import Counter
    from urllib.parse import urlsplit

    import aiohttp

    from fleetgate.gateway.tenancy.keys import new_key
    from fleetgate.gateway.tenancy.stage import TenancyStage

    from .epp_stack import epp_stack, settings_for

    key, key_hash = new_key()
    engine = urlsplit(stack.engine)
    settings = settings_for({MODEL: [stack.engine]}, server={"auth": "api_key"},
                            tenancy={"tenants": [{"id": "acme", "key_hashes": [key_hash]}]})
    body = {"model": MODEL, "prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with epp_stack(settings, pool=[engine.port or 80]) as front, aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(f"{front.url}/v1/completions", json=body) as r:
            assert r.status == 200 and r.headers["x-gateway-destination-endpoint-served"] == engine.netloc
            events = [line[6:] for line in (await r.read()).decode().split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).strip()
        (usage,) = [c["usage"] for c in chunks if c.get("usage")]
        assert usage["completion_tokens"] == 12
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 24, "temperature": 0}
        async with session.post(f"{front.url}/v1/chat/completions", json=chat) as r:
            assert r.status == 200
            answer = await r.json()
        assert "Paris" in answer["choices"][0]["message"]["content"]
        await front.drain()
        assert front.epp is not None and isinstance(front.epp.stages.accountant, TenancyStage)
        rows = await front.epp.stages.accountant.ledger.read(days=[dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")],
                                                             tenant="acme")
        totals: Counter[str] = Counter()
        for row in rows:
            totals.update(row.values)
        # charged exactly what the engine reported, for both requests
        assert totals["completion_tokens"] == 12 + answer["usage"]["completion_tokens"]
        assert totals["prompt_tokens"] == usage["prompt_tokens"] + answer["usage"]["prompt_tokens"]


@contextmanager
def fake_engine(model: str) -> Iterator[FakeEngine]:
    """A fake engine (no KV cache, no events) on its own event loop thread: the endpoint that does not hold a prefix."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-engine", daemon=True)
    thread.start()
    engine = FakeEngine(FakeEngineConfig(model=model))
    asyncio.run_coroutine_threadsafe(engine.start(), loop).result(timeout=30)
    try:
        yield engine
    finally:
        asyncio.run_coroutine_threadsafe(engine.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def _wait(predicate: Callable[[], bool], *, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_precise_routing_follows_the_engines_own_kv_events(stack: Stack) -> None:
    """The engine's KV events (vLLM CPU 0.32, tagged-map msgpack) rebuild the blocks it holds under FleetGate's own
    token hashes: the set predicts exactly the prefix-cache hits the engine then reports in /metrics, and the
    precise profile sends a prompt to the engine holding its prefix, even one this gateway never saw."""
    engine_id = stack.engine.removeprefix("http://")
    with fake_engine(MODEL) as other:
        settings = GatewaySettings(
            server=ServerSettings(log_requests=False, auth="open", debug_headers=True),
            models=[ModelRoute(name=MODEL, endpoints=[stack.engine, other.url], kv_events=[KvEventsRoute(
                endpoint=stack.engine, publisher=stack.kv_publisher, replay=stack.kv_replay, topic="kv")])],
            # The prefix alone decides here (ties between the two endpoints are broken at random).
            routing=precise_prefix_config({"hotspotMargin": None}),
        )
        with serving(settings) as (gateway, server):
            scheduler = server.config.app.state.stages.scheduler
            (precise,) = [s for s, _ in scheduler.profile.scorers if isinstance(s, PrecisePrefixScorer)]
            assert _wait(lambda: (st := precise.fleet.state(engine_id)) is not None and st.usable()), "no KV events"
            state = precise.fleet.state(engine_id)
            assert state is not None
            # A prompt sent to the engine directly: the gateway's approximate index never sees it.
            prompt = "The orchard keeper counts apples under the old walnut tree. " * 30 + "How many?"
            status, tokenized = request_json(f"{stack.engine}/tokenize", {"model": MODEL, "prompt": prompt})
            assert status == 200
            tokens = tokenized["tokens"]
            status, _ = request_json(f"{stack.engine}/v1/completions",
                                     {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
            assert status == 200
            assert _wait(lambda: state.blocks.block_size is not None)
            size = state.blocks.block_size
            assert size is not None
            hashes = token_block_hashes(tokens, block_size=size)
            assert len(hashes) >= 2, f"the prompt must span blocks of {size} tokens ({len(tokens)} tokens)"
            assert _wait(lambda: state.blocks.match(hashes) == len(hashes)), (state.blocks.match(hashes), len(hashes))
            assert state.stats.decode_errors == 0 and state.stats.applied.orphaned == 0

            # What the set predicts is what the engine's own prefix cache then serves (vLLM recomputes the last
            # prompt token, so a hit never covers the whole prompt).
            predicted = min(state.blocks.match(hashes) * size, (len(tokens) - 1) // size * size)
            before = _counter(_text(f"{stack.engine}/metrics"), "vllm:prefix_cache_hits_total")
            status, _ = request_json(f"{stack.engine}/v1/completions",
                                     {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
            assert status == 200
            after = _counter(_text(f"{stack.engine}/metrics"), "vllm:prefix_cache_hits_total")
            assert after - before == predicted > 0

            # Through the precise gateway: every request with that prefix goes to the engine that holds it.
            chosen = []
            for k in range(4):
                status, body, headers = post_json_headers(
                    f"{gateway}/v1/completions",
                    {"model": MODEL, "prompt": prompt + f" Question {k}.", "max_tokens": 1, "temperature": 0})
                assert status == 200, body
                chosen.append(headers.get("x-fleetgate-endpoint"))
            assert chosen == [engine_id] * 4, chosen
            final = _counter(_text(f"{stack.engine}/metrics"), "vllm:prefix_cache_hits_total")
            assert final - after >= 4 * predicted
            assert precise.fleet.fallbacks.get("tokenize", 0) == 0


def test_the_local_tokenizer_gives_the_engines_own_tokens(stack: Stack) -> None:
    """`tokenizer: local` (the model's tokenizer in the gateway) must produce what the engine's `/tokenize` does, or
    precise routing would silently match nothing: chat (template applied) and completions, special tokens included."""
    local = LocalTokenizer(paths={MODEL: str(stack.model_path)}, cache_entries=8)
    engine = Endpoint(id="e", url=stack.engine, model=MODEL)
    remote = EngineTokenizer(choose=lambda eps: eps[0], timeout_s=30.0, cache_entries=8)
    bodies = [
        ("chat", {"messages": [{"role": "system", "content": "You answer in French."},
                               {"role": "user", "content": "Where is the bakery? Über café, naïve résumé."}]}),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text",
                                                                                             "text": " parts"}]}]}),
        ("completions", {"prompt": "The three primary colours are"}),
    ]
    # A shared system prompt (several chunks of the segment-wise encode, newlines inside) sent three times: the
    # third is read from the segment cache; the users' messages hold special-token text, parsed as the engine does.
    system = "\n".join(f"Rule {i}: answer in French, cite the source, keep it short." for i in range(24))
    for question in ("Où est la gare?", "Say <end_of_turn> then <bos> and\n\nstop.", "Trois\n\n\nlignes <eos>"):
        bodies.append(("chat", {"messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": question}]}))
        bodies.append(("completions", {"prompt": f"{system}\nQuestion: {question}"}))

    async def both() -> list[tuple[list[int] | None, list[int] | None]]:
        await local.warm(30.0)  # the tokenizer loads in a thread, as at the gateway's start-up
        out = []
        for kind, body in bodies:
            req = RoutingRequest(request_id="t", model=MODEL, prompt_text="", kind=kind, body=body)
            out.append((await local.tokens(req, [engine]), await remote.tokens(req, [engine])))
        await remote.aclose()
        return out

    for (kind, _body), (ours, theirs) in zip(bodies, asyncio.run(both()), strict=True):
        assert theirs, kind
        assert ours == theirs, (kind, ours, theirs)
    segments = local._loaded[MODEL].segments
    assert segments is not None and segments.cache.hits > 0  # the segment-wise encode was in use, cache and all
