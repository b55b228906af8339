"""`fleetgate.engine.lora_api` against a small local aiohttp server that answers like vLLM (or does not)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from fleetgate.core.adapters import LoadedAdapter
from fleetgate.engine.lora_api import (
    AdapterApiError,
    is_models_body,
    load_adapter,
    loaded_adapters,
    parse_loaded,
    unload_adapter,
)


@dataclass
class Engine:
    """What the fake answers next: (status, body) per path, a delay, and what it received."""

    replies: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    delay_s: float = 0.0
    received: list[tuple[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    state = Engine()

    async def handle(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read()) if request.method == "POST" else None
        state.received.append((request.path, body))
        await asyncio.sleep(state.delay_s)
        status, payload = state.replies.get(request.path, (404, b"{}"))
        return web.Response(status=status, body=payload, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def _error(message: str) -> bytes:
    return orjson.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": 400})


async def test_load_sends_name_and_path_and_accepts_already_loaded(engine: Engine, session: Any) -> None:
    engine.replies["/v1/load_lora_adapter"] = (200, b"Success: LoRA adapter 'legal' added successfully.")
    await load_adapter(session, engine.url, name="legal", source="/adapters/legal")
    assert engine.received == [("/v1/load_lora_adapter", {"lora_name": "legal", "lora_path": "/adapters/legal"})]
    engine.replies["/v1/load_lora_adapter"] = (400, _error("The lora adapter 'legal' has already been loaded."))
    await load_adapter(session, engine.url, name="legal", source="/adapters/legal")  # idempotent


@pytest.mark.parametrize(
    ("status", "body"),
    [(400, _error("No adapter found for /nope")), (500, b"Internal Server Error"), (404, b"Not Found")],
)
async def test_load_failures_raise_with_the_status(engine: Engine, session: Any, status: int, body: bytes) -> None:
    engine.replies["/v1/load_lora_adapter"] = (status, body * 100)  # a long body is cut short
    with pytest.raises(AdapterApiError) as info:
        await load_adapter(session, engine.url, name="legal", source="/nope")
    assert info.value.status == status and "legal" in str(info.value)
    assert len(str(info.value)) < 400


async def test_unload_accepts_not_loaded(engine: Engine, session: Any) -> None:
    engine.replies["/v1/unload_lora_adapter"] = (200, b"Success")
    await unload_adapter(session, engine.url, name="legal")
    assert engine.received[-1] == ("/v1/unload_lora_adapter", {"lora_name": "legal"})
    engine.replies["/v1/unload_lora_adapter"] = (404, _error("The lora adapter 'legal' cannot be found."))
    await unload_adapter(session, engine.url, name="legal")
    engine.replies["/v1/unload_lora_adapter"] = (400, _error("The lora adapter 'legal' is not loaded"))  # older builds
    await unload_adapter(session, engine.url, name="legal")
    engine.replies["/v1/unload_lora_adapter"] = (500, b"boom")
    with pytest.raises(AdapterApiError) as info:
        await unload_adapter(session, engine.url, name="legal")
    assert info.value.status == 500


async def test_timeouts_and_unreachable_engines_raise_status_0(engine: Engine, session: Any) -> None:
    engine.delay_s = 1.0
    engine.replies["/v1/load_lora_adapter"] = (200, b"ok")
    for call in (
        load_adapter(session, engine.url, name="a", source="/a", timeout_s=0.1),
        unload_adapter(session, engine.url, name="a", timeout_s=0.1),
        loaded_adapters(session, engine.url, timeout_s=0.1),
    ):
        with pytest.raises(AdapterApiError) as info:
            await call
        assert info.value.status == 0
    with pytest.raises(AdapterApiError) as info:
        await load_adapter(session, "http://127.0.0.1:9", name="a", source="/a", timeout_s=1)
    assert info.value.status == 0


VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "org/base", "object": "model", "root": "org/base", "parent": None},
        {"id": "legal", "object": "model", "root": "/adapters/legal", "parent": "org/base"},
        {"id": "chef", "object": "model", "root": "/adapters/chef", "parent": "org/base"},
    ],
}


async def test_loaded_adapters_reads_vllms_model_list(engine: Engine, session: Any) -> None:
    engine.replies["/v1/models"] = (200, orjson.dumps(VLLM_MODELS))
    assert await loaded_adapters(session, engine.url) == [
        LoadedAdapter(name="legal", base="org/base", source="/adapters/legal"),
        LoadedAdapter(name="chef", base="org/base", source="/adapters/chef"),
    ]
    engine.replies["/v1/models"] = (503, b"{}")
    with pytest.raises(AdapterApiError) as info:
        await loaded_adapters(session, engine.url)
    assert info.value.status == 503


@pytest.mark.parametrize(
    "body",
    [b"<html>not json</html>", b"null", b"[]", b'"text"', b'{"data": "x"}', b'{"object": "list"}', b"{"],
)
async def test_garbage_model_lists_read_as_none_unless_strict(engine: Engine, session: Any, body: bytes) -> None:
    engine.replies["/v1/models"] = (200, body)
    try:
        lenient = await loaded_adapters(session, engine.url)
    except AdapterApiError:
        lenient = None  # not JSON at all: an error either way
    assert lenient in (None, [])
    with pytest.raises(AdapterApiError):  # a caller keeping state must be able to tell garbage from "none"
        await loaded_adapters(session, engine.url, strict=True)


async def test_strict_accepts_an_empty_list(engine: Engine, session: Any) -> None:
    engine.replies["/v1/models"] = (200, b'{"object": "list", "data": []}')
    assert await loaded_adapters(session, engine.url, strict=True) == []


def test_parse_loaded_skips_malformed_entries() -> None:
    body = {
        "data": [
            "legal",
            None,
            3,
            {"id": 5, "parent": "b"},
            {"id": "x", "parent": 7},
            {"id": "base", "parent": "base"},
            {"id": "y", "parent": ""},
            {"id": "ok", "parent": "b", "root": ["not", "a", "str"]},
            {"id": "ok2", "parent": "b", "root": "/p"},
        ]
    }
    assert parse_loaded(body) == [
        LoadedAdapter(name="ok", base="b", source=None),
        LoadedAdapter(name="ok2", base="b", source="/p"),
    ]
    assert parse_loaded(None) == parse_loaded([]) == parse_loaded({"data": {}}) == []
    assert is_models_body({"data": []}) and not is_models_body({"data": None}) and not is_models_body([])
