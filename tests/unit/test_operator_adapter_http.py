"""`VllmAdapterApi` against a local HTTP server that speaks vLLM's runtime LoRA API: the operator's real client
loads, lists and unloads, and a stalled engine costs one bounded wait, reported as the adapter's failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from fleetgate.operator.adapters import EnginePod, VllmAdapterApi, sync_adapters
from fleetgate.operator.resolve import ResolvedAdapter


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"loras": {}, "stall": False}

    async def models(_: web.Request) -> web.Response:
        data = [{"id": "base", "root": "/m", "parent": None}]
        data += [{"id": n, "root": p, "parent": "base"} for n, p in state["loras"].items()]
        return web.json_response({"object": "list", "data": data})

    async def load(request: web.Request) -> web.Response:
        if state["stall"]:
            await asyncio.sleep(2)
        body = await request.json()
        if body["lora_name"] in state["loras"]:
            return web.json_response({"message": "already been loaded"}, status=400)
        state["loras"][body["lora_name"]] = body["lora_path"]
        return web.Response(text="Success")

    async def unload(request: web.Request) -> web.Response:
        body = await request.json()
        if state["loras"].pop(body["lora_name"], None) is None:
            return web.json_response({"message": "not found"}, status=404)
        return web.Response(text="Success")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/load_lora_adapter", load)
    app.router.add_post("/v1/unload_lora_adapter", unload)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


async def test_load_list_unload_through_http(engine: tuple[str, dict[str, Any]]) -> None:
    url, state = engine
    api = VllmAdapterApi()
    pod = EnginePod(name="p", url=url)
    try:
        desired = [ResolvedAdapter(name="sql", path="/a/sql"), ResolvedAdapter(name="legal", path="org/legal")]
        [result] = await sync_adapters(api=api, pods=[pod], desired=desired, served_model="base")
        assert result.loaded == ("legal", "sql") and not result.failed
        assert state["loras"] == {"sql": "/a/sql", "legal": "org/legal"}
        [again] = await sync_adapters(api=api, pods=[pod], desired=desired[1:], served_model="base")
        assert again.loaded == ("legal",) and state["loras"] == {"legal": "org/legal"}
    finally:
        await api.aclose()


async def test_a_stalled_engine_is_a_bounded_failure(engine: tuple[str, dict[str, Any]]) -> None:
    url, state = engine
    state["stall"] = True
    api = VllmAdapterApi(load_timeout_s=0.3)
    try:
        started = asyncio.get_running_loop().time()
        [result] = await sync_adapters(
            api=api, pods=[EnginePod(name="p", url=url)], desired=[ResolvedAdapter(name="sql", path="/a")],
            served_model="base",
        )  # fmt: skip
        assert asyncio.get_running_loop().time() - started < 2
        assert result.loaded == () and result.failed[0][0] == "sql" and "Timeout" in result.failed[0][1]
    finally:
        await api.aclose()
