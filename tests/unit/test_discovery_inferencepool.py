"""InferencePool discovery: the pool's selector and target ports over ready pods, and the watch keeping it current.

The index is pure (tested directly); the watch loop runs against kmock, an in-process Kubernetes API mock,
with pools and pods created, changed and deleted through the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kmock._internal import apps
from prometheus_client import CollectorRegistry

from fleetgate.gateway.discovery import EndpointSource
from fleetgate.gateway.discovery.inferencepool import InferencePoolSource, build_pool_index, pool_info
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.wiring import build_endpoint_source

from .kmock_api import client, eventually


def pool(name: str, *, ports: tuple[int, ...] = (8000,), model: str | None = None, namespace: str = "ml",
         selector: dict[str, str] | None = None, kv_topic: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": {}}
    if model:
        meta["annotations"]["fleetgate.io/served-model"] = model
    if kv_topic is not None:
        meta["annotations"]["fleetgate.io/kv-events-topic"] = kv_topic
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": meta,
            "spec": {"selector": {"matchLabels": selector or {"app": name}},
                     "targetPorts": [{"number": p} for p in ports],
                     "endpointPickerRef": {"name": "fleetgate-epp", "port": {"number": 9002}}}}


def pod(name: str, ip: str | None, *, app: str, ready: bool = True, namespace: str = "ml",
        deleting: bool = False, ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": app, "other": "x"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "e", "image": "i", "ports": ports or []}]}, "status": status}


def test_index_takes_ready_selected_pods_on_every_target_port() -> None:
    pools = {("ml", "llama"): pool_info(pool("llama", ports=(8000, 8001), model="llama-8b")),
             ("ml", "qwen"): pool_info(pool("qwen"))}
    pods = {("ml", p["metadata"]["name"]): p for p in [
        pod("a", "10.0.0.1", app="llama"), pod("b", "10.0.0.2", app="llama", ready=False),
        pod("c", None, app="llama"), pod("d", "10.0.0.4", app="llama", deleting=True),
        pod("e", "10.0.0.5", app="qwen"), pod("f", "10.0.0.6", app="unrelated")]}
    pods[("prod", "g")] = pod("g", "10.1.0.1", app="llama", namespace="prod")  # another namespace: not the pool's
    index = build_pool_index(pools={k: v for k, v in pools.items() if v is not None}, pods=pods)
    assert {m: [e.url for e in eps] for m, eps in index.items()} == {
        "llama-8b": ["http://10.0.0.1:8000", "http://10.0.0.1:8001"],  # the annotation names the model
        "qwen": ["http://10.0.0.5:8000"],  # no annotation: the pool's name
    }
    endpoint = index["llama-8b"][0]
    assert endpoint.id == "10.0.0.1:8000" and endpoint.model == "llama-8b"
    assert endpoint.labels == {"inferencepool": "llama", "namespace": "ml", "pod": "a"}


def test_pools_of_engines_publishing_kv_events_tell_the_precise_scorer_where() -> None:
    """The operator annotates the pool with the topic and names the pod's ports: each endpoint gets the labels the
    precise prefix scorer subscribes with, as Kubernetes discovery gives them; without both, none."""
    named = [{"name": "http", "containerPort": 8000}, {"name": "kv-events", "containerPort": 5557},
             {"name": "kv-replay", "containerPort": 5558}]
    pools = {("ml", "llama"): pool_info(pool("llama", kv_topic="llama-kv")), ("ml", "qwen"): pool_info(pool("qwen"))}
    pods = {("ml", "a"): pod("a", "10.0.0.1", app="llama", ports=named),
            ("ml", "b"): pod("b", "fd00::2", app="llama", ports=named[:2]),  # no replay port
            ("ml", "c"): pod("c", "10.0.0.3", app="llama"),  # ports not named: nothing to subscribe to
            ("ml", "d"): pod("d", "10.0.0.4", app="qwen", ports=named)}  # the pool announces no topic
    index = build_pool_index(pools={k: v for k, v in pools.items() if v is not None}, pods=pods)
    labels = {e.labels["pod"]: {k: v for k, v in e.labels.items() if k.startswith("kv_")}
              for eps in index.values() for e in eps}
    assert labels == {
        "a": {"kv_events": "tcp://10.0.0.1:5557", "kv_events_replay": "tcp://10.0.0.1:5558",
              "kv_events_topic": "llama-kv"},
        "b": {"kv_events": "tcp://[fd00::2]:5557", "kv_events_topic": "llama-kv"},
        "c": {}, "d": {},
    }


def test_pools_that_would_select_everything_or_nothing_are_ignored() -> None:
    assert pool_info({**pool("x"), "spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}}) is None
    assert pool_info(pool("x", ports=())) is None
    assert pool_info({"metadata": {"name": "x"}}) is None
    assert build_pool_index(pools={("ml", "q"): pool_info(pool("q"))}, pods={}) == {"q": []}  # type: ignore[dict-item]


def test_the_wiring_builds_it_from_the_discovery_section() -> None:
    settings = GatewaySettings.model_validate(
        {"discovery": {"kind": "inferencepool", "namespace": "ml", "pool": "llama", "pod_label_selector": "a=b"}})
    source = build_endpoint_source(settings, registry=CollectorRegistry(), kvstore=None)  # type: ignore[arg-type]
    assert isinstance(source, InferencePoolSource) and isinstance(source, EndpointSource)


@pytest.fixture
async def api_url() -> AsyncIterator[str]:
    server = kmock.KubernetesEmulator()
    verbs = {"list", "watch", "get", "create", "patch", "delete"}
    server.resources["inference.networking.k8s.io/v1/inferencepools"] = kmock.ResourceInfo(
        kind="InferencePool", namespaced=True, verbs=verbs)
    server.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs=verbs)
    async with server, apps.Server(server):
        yield str(server.url).rstrip("/")


@pytest.mark.timeout(60)
async def test_watch_follows_pools_and_pods(api_url: str) -> None:
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    pool_cls = InferencePoolSource._resource()
    admin = client(api_url)
    await admin.create(pool_cls.from_dict(pool("llama", model="llama-8b")))
    await admin.create(pool_cls.from_dict(pool("other")))
    await admin.create(Pod.from_dict(pod("a", "10.0.0.1", app="llama")))
    registry = CollectorRegistry()
    source = InferencePoolSource(client_factory=lambda: client(api_url), namespace="ml", pool="llama",
                                 resync_s=60, registry=registry, retry_s=0.1)
    await source.start()
    try:
        assert source.models() == ["llama-8b"]  # listed before start() returns; only the named pool
        assert [e.url for e in source.endpoints("llama-8b")] == ["http://10.0.0.1:8000"]
        await admin.create(Pod.from_dict(pod("b", "10.0.0.2", app="llama", ready=False)))
        await admin.patch(Pod, "b", pod("b", "10.0.0.2", app="llama"), namespace="ml", patch_type=PatchType.MERGE)
        await eventually(lambda: len(source.endpoints("llama-8b")) == 2)
        assert registry.get_sample_value("fleetgate_pool_endpoints", {"model": "llama-8b"}) == 2
        await admin.patch(pool_cls, "llama", {"spec": {"targetPorts": [{"number": 9000}]}}, namespace="ml",
                          patch_type=PatchType.MERGE)
        await eventually(lambda: [e.url for e in source.endpoints("llama-8b")] ==
                          ["http://10.0.0.1:9000", "http://10.0.0.2:9000"])
        await admin.delete(Pod, "a", namespace="ml")
        await eventually(lambda: [e.url for e in source.endpoints("llama-8b")] == ["http://10.0.0.2:9000"])
        await admin.delete(pool_cls, "llama", namespace="ml")
        await eventually(lambda: source.models() == [])
        assert registry.get_sample_value("fleetgate_pool_endpoints", {"model": "llama-8b"}) is None
    finally:
        await source.aclose()
        await admin.close()
