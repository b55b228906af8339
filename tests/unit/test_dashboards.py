"""The Grafana dashboards in charts/fleetgate/dashboards: valid dashboards whose every query parses as
PromQL and refers only to metrics a real gateway exports.

The metric names come from a real app's /metrics after real requests: the gateway (create_app on
uvicorn) with its tenancy stage, the real router scheduler and the real response cache (exact +
semantic with the light hashing embedder), in front of the fake engine.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.cache.build import build_cache
from fleetgate.cache.config import CacheConfig
from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.localredis import free_port
from fleetgate.gateway.discovery import StaticEndpointSource
from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.router.build import build_scheduler
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "charts" / "fleetgate" / "dashboards").glob("*.json"))
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}
KEY, KEY_HASH = new_key()


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(board) for t in p.get("targets", []) if t.get("expr")]


def as_promql(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus would see."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)  # multi-value variables are used in =~ matchers


def selectors(node: Any) -> Iterator[str]:
    """Metric names of every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        return
    if isinstance(node, promql_parser.MatrixSelector):
        yield from selectors(node.vector_selector)
        return
    if isinstance(node, promql_parser.BinaryExpr):
        yield from selectors(node.lhs)
        yield from selectors(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from selectors(arg)
    elif isinstance(node, (promql_parser.AggregateExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr,
                           promql_parser.SubqueryExpr)):
        yield from selectors(node.expr)


def referenced(board: dict[str, Any]) -> set[str]:
    names = {n for e in exprs(board) for n in selectors(promql_parser.parse(as_promql(e)))}
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.match(r"label_values\((\w+),", query)
            assert match, f"unsupported variable query {query!r}"
            names.add(match.group(1))
    return names


def test_the_extractor_finds_every_selector() -> None:
    expr = ('histogram_quantile(0.9, sum by (le) (rate(a_bucket{x=~"$tenant"}[$__rate_interval]))) '
            '/ on (tenant) group_left b_total - -(c) + sum(d offset 5m) * max_over_time(e[10m:1m])')
    assert set(selectors(promql_parser.parse(as_promql(expr)))) == {"a_bucket", "b_total", "c", "d", "e"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_is_a_valid_grafana_dashboard(path: Path) -> None:
    board = load(path)
    assert board["title"].startswith("FleetGate") and board["uid"] and board["schemaVersion"] >= 36
    ds_vars = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds_vars) == 1 and ds_vars[0]["query"] == "prometheus" and ds_vars[0]["name"] == "datasource"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    occupied: set[tuple[int, int]] = set()
    for p in panels(board):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
    for e in exprs(board):
        promql_parser.parse(as_promql(e))  # raises on invalid PromQL


def test_dashboards_cover_the_issue() -> None:
    every = " ".join(e for path in DASHBOARDS for e in exprs(load(path)))
    for needed in ("fleetgate_tenant_cost_usd_total", "fleetgate_tenant_savings_usd_total",
                   "fleetgate_tenant_tokens_total", "fleetgate_time_to_first_token_seconds_bucket",
                   "fleetgate_time_per_output_token_seconds_bucket", "fleetgate_cache_lookups_total",
                   "fleetgate_router_picks_total", "fleetgate_tenant_budget_usd", "fleetgate_adapter_info",
                   "fleetgate_adapter_loads_total"):
        assert needed in every, needed
    assert 'cache=~"hit.*"' in every and 'source="tiering"' in every


@pytest.fixture
async def exported() -> AsyncIterator[set[str]]:
    """Metric names on a real gateway's /metrics after streamed, plain, cached and refused requests."""
    engine = await FakeEngine(FakeEngineConfig(model="m1", default_max_tokens=8)).start()
    settings = GatewaySettings.model_validate({
        "server": {"auth": "api_key"},
        "models": [{"name": "m1", "endpoints": [engine.url], "adapters": [{"name": "m1-ft", "source": "/a"}]}],
        "tenancy": {"tenants": [{"id": "acme", "key_hashes": [KEY_HASH], "rpm": 4, "daily_budget_usd": "1"}],
                    "prices": {"m1": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}},
                    "savings_baseline_model": "m1"},
    })
    kvstore = MemoryKVStore()
    registry = CollectorRegistry()
    source = StaticEndpointSource(settings.models)
    scheduler = build_scheduler(None, kvstore=kvstore, registry=registry, source=source, scrape=False)
    cache_config = CacheConfig.model_validate({"semantic": {"embedder": "hashing"}, "store_truncated": True})
    cache = build_cache(cache_config, kvstore=kvstore, registry=registry)
    port = free_port()
    server = build_server(settings, port=port, metrics_port=0, registry=registry, kvstore=kvstore,
                          scheduler=scheduler, cache=cache, endpoint_source=source)
    task = asyncio.ensure_future(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "m1", "temperature": 0, "messages": [{"role": "user", "content": "how much is it"}]}
        async with httpx.AsyncClient(base_url=url, timeout=20) as c:
            assert (await c.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
            await server.config.app.state.pipeline.drain()
            hit = await c.post("/v1/chat/completions", json=body, headers=headers)
            assert hit.status_code == 200
            async with c.stream("POST", "/v1/chat/completions", headers=headers,
                                json={**body, "stream": True, "temperature": 1.0}) as s:
                assert s.status_code == 200
                await s.aread()
            codes = [(await c.post("/v1/chat/completions", json=body, headers=headers)).status_code
                     for _ in range(3)]
            assert 429 in codes
            await server.config.app.state.pipeline.drain()
            text = (await c.get(server.config.app.state.metrics_listener.url)).text
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        await engine.stop()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_count", "_sum")}
        names |= {s.name for s in family.samples}
    assert 'cache="hit-exact"' in text and 'fleetgate_tenant_savings_usd_total{model="m1",source="cache"' in text
    assert 'fleetgate_adapter_info{base="m1",model="m1-ft"} 1.0' in text
    yield names


async def test_every_query_refers_to_an_exported_metric(exported: set[str]) -> None:
    for path in DASHBOARDS:
        missing = referenced(load(path)) - exported
        assert not missing, f"{path.name} queries metrics the gateway does not export: {sorted(missing)}"
