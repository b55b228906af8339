"""The component tests' fake engine with vLLM's runtime LoRA API (a subclass: `fleetgate.sim` is not changed).

`POST /v1/load_lora_adapter` (200, or 400 "already loaded"), `POST /v1/unload_lora_adapter` (200, 404 when
not loaded), `GET /v1/models` listing each loaded adapter with `parent` = the base model, and completions
for an adapter that is not loaded answered 404 like vLLM. Knobs: a load delay, a load failure status, a
garbage `/v1/models`; it counts load calls and records the model of each completion.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig


@dataclass(slots=True)
class LoraKnobs:
    loaded: set[str] = field(default_factory=set)
    load_delay_s: float = 0.0
    load_fail_status: int | None = None
    models_garbage: bool = False
    load_calls: int = 0
    loads_cancelled: int = 0
    served: list[str] = field(default_factory=list)  # the model of each completion received


def _json(status: int, obj: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


class LoraFakeEngine(FakeEngine):
    def __init__(self, config: FakeEngineConfig, *, loaded: set[str] | None = None) -> None:
        super().__init__(config)
        self.lora = LoraKnobs(loaded=set(loaded or ()))

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        return app

    async def _load(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        name = body["lora_name"]
        self.lora.load_calls += 1
        try:
            await asyncio.sleep(self.lora.load_delay_s)
        except asyncio.CancelledError:
            self.lora.loads_cancelled += 1
            raise
        if self.lora.load_fail_status is not None:
            return _json(self.lora.load_fail_status, {"error": {"message": "cannot read /secret/path"}})
        if name in self.lora.loaded:
            return _json(400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}})
        self.lora.loaded.add(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, request: web.Request) -> web.Response:
        name = orjson.loads(await request.read())["lora_name"]
        if name not in self.lora.loaded:
            return _json(404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}})
        self.lora.loaded.discard(name)
        return web.Response(text="Success")

    async def _models(self, request: web.Request) -> web.Response:
        if self.lora.models_garbage:
            return web.Response(text="<html>nope</html>", content_type="text/html")
        base = self.config.model
        data = [{"id": base, "object": "model", "root": base, "parent": None}]
        data += [
            {"id": n, "object": "model", "root": f"/adapters/{n}", "parent": base} for n in sorted(self.lora.loaded)
        ]
        return _json(200, {"object": "list", "data": data})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        model = orjson.loads(await request.read()).get("model")
        self.lora.served.append(str(model))
        if model != self.config.model and model not in self.lora.loaded:
            return _json(404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}})
        return await super()._completion(request)
