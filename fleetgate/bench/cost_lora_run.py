"""One LoRA configuration of the cost benchmark: a fresh layout of simulated engines, a fresh gateway, the
whole LoRA workload through it over HTTP, then the figures of that run.

Configurations (`LORA_CONFIGS`):
- `deployments`: one gateway model per fine-tune, each on its own deployment;
- `adapters+affinity`: the fine-tunes as adapters (`models[].adapters`) of one base model, routed by the
  `adapter-affinity` preset (least-loaded plus the adapter-affinity scorer);
- `adapters+blind`: the same fleet and gateway with the adapter-blind `least-loaded` preset.
In both adapter configurations no engine starts with an adapter: the gateway loads each on demand on the
engine it picked (`server.adapter_load_timeout_s` bounds the wait), as a fresh deployment would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fleetgate.bench.cost_lora import BASE_MODEL, LoraFleet, LoraSetup, size_layouts, start_layout
from fleetgate.bench.cost_run import Outcome, _keys, replay, stop_gateway
from fleetgate.bench.workload import Workload
from fleetgate.core.localredis import free_port


@dataclass(frozen=True, slots=True)
class LoraConfig:
    name: str
    shared: bool
    policy: str  # routing preset of the gateway


LORA_CONFIGS: tuple[LoraConfig, ...] = (
    LoraConfig("deployments", shared=False, policy="least-loaded"),
    LoraConfig("adapters+affinity", shared=True, policy="adapter-affinity"),
    LoraConfig("adapters+blind", shared=True, policy="least-loaded"),
)


@dataclass(slots=True)
class LoraResult:
    config: LoraConfig
    outcomes: list[Outcome] = field(default_factory=list)
    replicas: int = 0
    gpus: int = 0
    provisioned_usd: float = 0.0
    work_s: float = 0.0
    provisioned_s: float = 0.0
    disk_loads: int = 0
    slot_swaps: int = 0
    engine_ttft_s: list[float] = field(default_factory=list)


def gateway_settings(
    config: LoraConfig, fleet: LoraFleet, *, fine_tunes: list[str], tenants: list[str], keys: dict[str, str]
) -> Any:
    from fleetgate.gateway.settings import AdapterRoute, GatewaySettings, ModelRoute, ServerSettings
    from fleetgate.gateway.tenancy.config import TenancyConfig, TenantConfig
    from fleetgate.gateway.tenancy.keys import hash_key
    from fleetgate.router.config import preset

    if config.shared:
        adapters = [AdapterRoute(name=name, source=f"/adapters/{name}", rank=16) for name in fine_tunes]
        models = [ModelRoute(name=BASE_MODEL, endpoints=fleet.fleets[BASE_MODEL].urls, adapters=adapters)]
    else:
        models = [ModelRoute(name=name, endpoints=f.urls) for name, f in fleet.fleets.items()]
    tenancy = TenancyConfig(
        admin_key_hashes=[hash_key(keys["__admin__"])],
        tenants=[TenantConfig(id=t, key_hashes=[hash_key(keys[t])], rpm=100_000) for t in tenants],
    )
    return GatewaySettings(
        server=ServerSettings(auth="api_key", debug_headers=True, port=0),
        models=models,
        tenancy=tenancy,
        routing=preset(config.policy),
    )


async def run_lora_config(
    config: LoraConfig, workload: Workload, setup: LoraSetup, *, time_scale: float, progress: Any = None
) -> LoraResult:
    from fleetgate.gateway.serve import build_server, start_in_background

    tenants = sorted({item.tenant for item in workload.items})
    fine_tunes = sorted({item.adapter for item in workload.items if item.adapter is not None})
    keys = _keys(tenants)
    keys["__admin__"] = "fg-bench-admin-0123456789abcdef0123456789abcdef"
    per_ft, shared = size_layouts(workload, setup)
    fleet = await start_layout(setup, shared=config.shared, per_ft=per_ft, shared_replicas=shared)
    result = LoraResult(config=config)
    duration = workload.items[-1].at_s
    server = serve_task = None
    try:
        server = build_server(
            gateway_settings(config, fleet, fine_tunes=fine_tunes, tenants=tenants, keys=keys),
            host="127.0.0.1",
            port=(port := free_port()),
            metrics_port=0,
        )
        serve_task = await start_in_background(server)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            result.outcomes = await replay(
                session,
                url,
                workload,
                model_of=lambda item: item.adapter or BASE_MODEL,
                keys=keys,
                time_scale=time_scale,
                progress=progress,
                name=config.name,
            )
    finally:
        try:
            await stop_gateway(server, serve_task)
        finally:
            result.replicas = fleet.replicas
            result.gpus = fleet.replicas * setup.gpus_per_replica
            result.provisioned_usd = fleet.provisioned_usd(duration_s=duration)
            result.provisioned_s = fleet.replicas * duration
            result.work_s = fleet.work_s()
            result.disk_loads, result.slot_swaps = fleet.lora_counts()
            result.engine_ttft_s = list(fleet.engine_ttft_s)
            await fleet.aclose()
    return result
