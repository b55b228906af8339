"""End to end: the gateway in front of a real vLLM CPU engine serving the prepared Gemma 3 270M.

One engine and one in-process gateway for the whole module (an engine takes about a minute to
start). The model directory is prepared on first use into the normal cache (`$FLEETGATE_CACHE` or
`~/.cache/fleetgate`), exactly as `fleetgate up` does.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings, ModelRoute, ServerSettings
from fleetgate.local.config import EngineConfig
from fleetgate.local.engines import EngineFleet, free_port
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.vllm_command import vllm_specs

from .http_json import request_json

pytestmark = pytest.mark.real_engine

MODEL = "gemma-3-270m"
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Stack:
    gateway: str
    engine: str


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    model_path = prepare_model()
    logs = tmp_path_factory.mktemp("engine-logs")
    config = EngineConfig(base_port=0, max_model_len=MAX_MODEL_LEN, max_num_seqs=4, log_dir=logs)
    fleet = EngineFleet(specs=vllm_specs(config=config, model_path=model_path), startup_timeout_s=900)
    with fleet:
        fleet.start()
        port = free_port()
        settings = GatewaySettings(
            server=ServerSettings(port=port, log_requests=False, auth="open"),
            models=[ModelRoute(name=MODEL, endpoints=fleet.urls)],
        )
        server = build_server(settings, metrics_port=0)
        thread = threading.Thread(target=server.run, name="gateway", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        try:
            yield Stack(gateway=f"http://127.0.0.1:{port}", engine=fleet.urls[0])
        finally:
            server.should_exit = True
            thread.join(timeout=30)


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
