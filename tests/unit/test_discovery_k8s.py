"""Kubernetes discovery: pod-level endpoints with tier and prices from the InferenceService.

The index is a pure function (tested directly); the watch loop runs against kmock, an in-process
Kubernetes API mock, with objects created, changed and deleted through the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kmock._internal import apps
from prometheus_client import CollectorRegistry

from fleetgate.gateway.discovery import EndpointSource, ModelListing, WakeTarget
from fleetgate.gateway.discovery.kubernetes import KubernetesEndpointSource, build_index, service_info

from .kmock_api import client, eventually

ISVC: dict[str, Any] = {
    "apiVersion": "fleetgate.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {
        "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
        "gateway": {"tier": "cheap", "pricing": {"inputPerMillionTokens": 0.1, "outputPerMillionTokens": 0.3}},
    },
}


def _slice(name: str, service: str, *eps: tuple[str, bool, str], namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service, "app.kubernetes.io/managed-by": "fleetgate"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready}, "targetRef": {"kind": "Pod", "name": pod}}
            for ip, ready, pod in eps
        ],
    }


def test_index_lists_ready_pods_with_tier_and_prices() -> None:
    info = service_info(ISVC)
    assert info is not None
    slices = {
        ("ml", "llama-a"): _slice("llama-a", "llama", ("10.0.0.1", True, "p1"), ("10.0.0.2", False, "p2")),
        ("ml", "llama-b"): _slice("llama-b", "llama", ("10.0.0.3", True, "p3")),
        ("ml", "other"): _slice("other", "other", ("10.0.0.9", True, "x")),
        ("prod", "llama-c"): _slice("llama-c", "llama", ("10.1.0.1", True, "y"), namespace="prod"),
    }
    index = build_index(services={("ml", "llama"): info}, slices=slices)
    eps = index["llama-8b"]
    assert [e.url for e in eps] == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    assert eps[0].model == "llama-8b" and eps[0].id == "10.0.0.1:8000"
    assert eps[0].labels["tier"] == "cheap"
    assert eps[0].labels["price_input_per_1m"] == "0.1" and eps[0].labels["pod"] == "p1"
    assert set(index) == {"llama-8b"}


def test_engines_that_publish_kv_events_carry_their_pod_addresses() -> None:
    isvc = {**ISVC, "spec": {**ISVC["spec"], "engine": {"kvEvents": {"port": 5600, "replayPort": 5601}}}}
    info = service_info(isvc)
    assert info is not None and info.kv_events_topic == "kv"
    slice_ = _slice("llama-a", "llama", ("10.0.0.1", True, "p1"), ("10.0.0.2", True, "p2"))
    slice_["ports"] += [{"name": "kv-events", "port": 5600}, {"name": "kv-replay", "port": 5601}]
    eps = build_index(services={("ml", "llama"): info}, slices={("ml", "llama-a"): slice_})["llama-8b"]
    assert [(e.labels["kv_events"], e.labels["kv_events_replay"], e.labels["kv_events_topic"]) for e in eps] == [
        ("tcp://10.0.0.1:5600", "tcp://10.0.0.1:5601", "kv"), ("tcp://10.0.0.2:5600", "tcp://10.0.0.2:5601", "kv")]
    # Without the spec field (or before the Service lists the ports) no endpoint claims an event address.
    plain = service_info(ISVC)
    assert plain is not None
    eps = build_index(services={("ml", "llama"): plain}, slices={("ml", "llama-a"): slice_})["llama-8b"]
    assert not any("kv_events" in e.labels for e in eps)
    unported = build_index(services={("ml", "llama"): info},
                           slices={("ml", "llama-a"): _slice("llama-a", "llama", ("10.0.0.1", True, "p1"))})
    assert "kv_events" not in unported["llama-8b"][0].labels


def test_service_without_pods_is_a_known_model_with_no_endpoints() -> None:
    info = service_info(ISVC)
    assert info is not None
    assert build_index(services={("ml", "llama"): info}, slices={}) == {"llama-8b": []}


def test_status_served_model_wins_and_name_is_the_fallback() -> None:
    bare = {"metadata": {"name": "m", "namespace": "n"}, "spec": {"model": {"source": "/x"}}}
    assert (info := service_info(bare)) is not None and info.served_model == "m"
    with_status = {**bare, "status": {"servedModel": "from-status"}}
    assert (info := service_info(with_status)) is not None and info.served_model == "from-status"
    assert service_info({"metadata": {}}) is None


@pytest.fixture
async def api_url() -> AsyncIterator[tuple[Any, str]]:
    server = kmock.KubernetesEmulator()
    verbs = {"list", "watch", "get", "create", "patch", "delete"}
    server.resources["fleetgate.io/v1alpha1/inferenceservices"] = kmock.ResourceInfo(
        kind="InferenceService", namespaced=True, verbs=verbs
    )
    server.resources["discovery.k8s.io/v1/endpointslices"] = kmock.ResourceInfo(
        kind="EndpointSlice", namespaced=True, verbs=verbs
    )
    async with server, apps.Server(server):
        yield server, str(server.url).rstrip("/")


@pytest.mark.timeout(60)
async def test_watch_follows_pods_and_services(api_url: tuple[Any, str]) -> None:
    from lightkube.core.resource_registry import resource_registry
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.discovery_v1 import EndpointSlice
    from lightkube.types import PatchType

    _server, url = api_url
    isvc_cls: Any = resource_registry.get("fleetgate.io/v1alpha1", "InferenceService") or create_namespaced_resource(
        "fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices"
    )
    admin = client(url)
    await admin.create(isvc_cls.from_dict(ISVC))
    await admin.create(EndpointSlice.from_dict(_slice("llama-a", "llama", ("10.0.0.1", True, "p1"))))

    registry = CollectorRegistry()
    source = KubernetesEndpointSource(
        client_factory=lambda: client(url), namespace="ml", label_selector="app.kubernetes.io/managed-by=fleetgate",
        resync_s=60, registry=registry, retry_s=0.1,
    )  # fmt: skip
    assert isinstance(source, EndpointSource)
    await source.start()
    try:
        assert source.models() == ["llama-8b"]  # listed before start() returns
        assert [e.url for e in source.endpoints("llama-8b")] == ["http://10.0.0.1:8000"]
        assert registry.get_sample_value("fleetgate_discovered_endpoints", {"model": "llama-8b"}) == 1

        grown = _slice("llama-a", "llama", ("10.0.0.1", True, "p1"), ("10.0.0.2", True, "p2"))
        await admin.patch(EndpointSlice, "llama-a", grown, namespace="ml", patch_type=PatchType.MERGE)
        await eventually(lambda: len(source.endpoints("llama-8b")) == 2)

        not_ready = _slice("llama-a", "llama", ("10.0.0.1", False, "p1"), ("10.0.0.2", True, "p2"))
        await admin.patch(EndpointSlice, "llama-a", not_ready, namespace="ml", patch_type=PatchType.MERGE)
        await eventually(lambda: [e.url for e in source.endpoints("llama-8b")] == ["http://10.0.0.2:8000"])

        await admin.delete(isvc_cls, "llama", namespace="ml")
        await eventually(lambda: source.models() == [])
        assert source.endpoints("llama-8b") == []
        # A deleted model is no longer reported (not frozen at its last count).
        assert registry.get_sample_value("fleetgate_discovered_endpoints", {"model": "llama-8b"}) is None
    finally:
        await source.aclose()
        await admin.close()


@pytest.mark.parametrize(("phase", "listed"), [("DoesNotFit", False), ("Invalid", False), ("Pending", True)])
def test_a_model_the_operator_creates_no_pods_for_is_not_offered(phase: str, listed: bool) -> None:
    info = service_info({**ISVC, "status": {"phase": phase, "servedModel": "llama-8b"}})
    assert info is not None
    assert ("llama-8b" in build_index(services={("ml", "llama"): info}, slices={})) is listed
    # Pods of an earlier spec that still serve keep the model offered.
    serving = {("ml", "llama-a"): _slice("llama-a", "llama", ("10.0.0.1", True, "p1"))}
    assert [e.url for e in build_index(services={("ml", "llama"): info}, slices=serving)["llama-8b"]] == [
        "http://10.0.0.1:8000"
    ]


def _isvc(**spec: Any) -> dict[str, Any]:
    return {**ISVC, "spec": {**ISVC["spec"], **spec}}


def test_listing_offers_models_with_endpoints_or_that_can_be_woken() -> None:
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    for name, spec in (
        ("ready", {}),
        ("idle", {"scaleToZeroAfterSeconds": 600, "replicas": 0}),
        ("starting", {}),
        ("stopped", {"replicas": 0}),
    ):
        body = _isvc(**spec)
        body = {**body, "metadata": {"name": name, "namespace": "ml"}, "spec": {**body["spec"], "model": {}}}
        source.apply_event("isvc", "ADDED", body)
    source.apply_event("slice", "ADDED", _slice("ready-a", "ready", ("10.0.0.1", True, "p1")))
    # All four are known (a request for one with no endpoint is 503, not 404) ...
    assert source.models() == ["idle", "ready", "starting", "stopped"]
    # ... but only those a client can be served are offered.
    assert source.listing() == [
        ModelListing(name="idle", ready=False, scaled_to_zero=True, wakeable=True),
        ModelListing(name="ready", ready=True),
    ]
    assert source.wake_targets("idle") == [WakeTarget(namespace="ml", name="idle", replicas=1)]
    assert source.wake_targets("stopped") == []  # scaled to zero by hand: not the gateway's to wake


def test_wake_replicas_restore_what_the_operator_scaled_down_from() -> None:
    body = _isvc(scaleToZeroAfterSeconds=600, replicas=0)
    body["metadata"] = {**body["metadata"], "annotations": {"fleetgate.io/wake-replicas": "3"}}
    info = service_info(body)
    assert info is not None and info.wake_replicas == 3
    unfit = service_info({**body, "status": {"phase": "DoesNotFit"}})
    assert unfit is not None and unfit.wake_replicas is None


@pytest.mark.timeout(60)
async def test_scale_and_mark_active_go_through_the_api(api_url: tuple[Any, str]) -> None:
    from lightkube.core.resource_registry import resource_registry
    from lightkube.generic_resource import create_namespaced_resource

    server, url = api_url
    isvc_cls: Any = resource_registry.get("fleetgate.io/v1alpha1", "InferenceService") or create_namespaced_resource(
        "fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices"
    )
    admin = client(url)
    await admin.create(isvc_cls.from_dict(_isvc(scaleToZeroAfterSeconds=600, replicas=0)))
    source = KubernetesEndpointSource(
        client_factory=lambda: client(url),
        namespace="ml",
        label_selector="app.kubernetes.io/managed-by=fleetgate",
        resync_s=60,
    )
    await source.start()
    try:
        assert [m.name for m in source.listing()] == ["llama-8b"]
        [target] = source.wake_targets("llama-8b")
        await source.scale(target)
        await source.mark_active("llama-8b")
        patches = [(str(r.url), r.data) for r in server if r.method == "PATCH"]
        assert any(
            u.endswith("/namespaces/ml/inferenceservices/llama/scale") and d == {"spec": {"replicas": 1}}
            for u, d in patches
        ), patches
        assert any(
            u.endswith("/namespaces/ml/inferenceservices/llama")
            and "fleetgate.io/last-request" in d["metadata"]["annotations"]
            for u, d in patches
        ), patches
    finally:
        await source.aclose()
        await admin.close()


def test_context_length_is_the_smallest_max_model_len_among_a_models_services() -> None:
    from fleetgate.gateway.discovery import context_length

    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    for name, engine in (("a", {"maxModelLen": 8192}), ("b", {"maxModelLen": 4096}), ("c", {})):
        body = _isvc(engine=engine)
        source.apply_event("isvc", "ADDED", {**body, "metadata": {"name": name, "namespace": "ml"}})
    assert context_length(source, "llama-8b") == 4096  # a request may land on either service
    assert context_length(source, "unknown") is None
    for bad in (True, -1, "8192"):
        assert (info := service_info(_isvc(engine={"maxModelLen": bad}))) is not None
        assert info.context_length is None


def _lora_isvc(name: str, served: str, adapters: list[dict[str, Any]], namespace: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"source": "hf://org/base", "servedName": served}, "adapters": adapters},
    }


def test_adapters_come_from_spec_adapters_with_the_served_model_as_base() -> None:
    from fleetgate.core.adapters import AdapterSpec

    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    adapters = [
        {"name": "sql", "source": "hf://acme/sql-lora", "rank": 16, "tenant": "acme"},
        {"name": "legal", "source": "pvc://loras/legal"},
        {"name": "streamed", "source": "s3://bucket/x"},  # the operator refuses it: never offered
        {"name": "Bad Name", "source": "/a"},
        {"name": "sql\n", "source": "/a"},  # a trailing newline: a ledger row, a CSV line, a Redis key apart
        {"name": "llama-8b", "source": "/a"},  # the base's own name
        "garbage",
    ]
    source.apply_event("isvc", "ADDED", _lora_isvc("llama", "llama-8b", adapters))
    source.apply_event("slice", "ADDED", _slice("llama-a", "llama", ("10.0.0.1", True, "p1"), ("10.0.0.2", True, "p2")))
    assert source.adapters() == [
        AdapterSpec(name="legal", base="llama-8b", source="/models/loras/legal"),
        AdapterSpec(name="sql", base="llama-8b", source="acme/sql-lora", rank=16, tenants=frozenset({"acme"})),
    ]
    # The contract: an adapter's endpoints are its base's; models() still lists base models only.
    assert [e.url for e in source.endpoints("sql")] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert source.endpoints("sql") == source.endpoints("llama-8b")
    assert source.models() == ["llama-8b"] and source.endpoints("streamed") == []
    # The request path's lookup is the source's own index, and agrees with the catalog.
    from fleetgate.gateway.discovery import AdapterLookup, adapter_named

    assert isinstance(source, AdapterLookup)
    assert adapter_named(source, "sql") == source.adapter("sql") == source.adapters()[1]
    assert source.adapter("llama-8b") is None and source.adapter("streamed") is None

    # Removing an adapter from the spec removes it from discovery; deleting the service removes them all.
    source.apply_event("isvc", "MODIFIED", _lora_isvc("llama", "llama-8b", adapters[1:2]))
    assert [a.name for a in source.adapters()] == ["legal"] and source.endpoints("sql") == []
    source.apply_event("isvc", "DELETED", _lora_isvc("llama", "llama-8b", []))
    assert source.adapters() == [] and source.endpoints("legal") == []


def test_adapter_names_never_shadow_a_model_and_the_first_service_wins() -> None:
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    source.apply_event("isvc", "ADDED", _lora_isvc("a", "base-a", [{"name": "shared", "source": "/x"},
                                                                 {"name": "base-b", "source": "/y"}]))  # fmt: skip
    source.apply_event("isvc", "ADDED", _lora_isvc("b", "base-b", [{"name": "shared", "source": "/z"}]))
    by_name = {a.name: a for a in source.adapters()}
    assert set(by_name) == {"shared"} and by_name["shared"].base == "base-a"


def test_adapters_of_an_unservable_base_are_not_offered() -> None:
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    body = {**_lora_isvc("big", "huge", [{"name": "sql", "source": "/a"}]), "status": {"phase": "DoesNotFit"}}
    source.apply_event("isvc", "ADDED", body)
    assert source.adapters() == []


def test_the_source_is_an_adapter_catalog() -> None:
    import fleetgate.gateway.discovery as discovery

    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    assert callable(source.adapters) and isinstance(source, EndpointSource)
    catalog = getattr(discovery, "AdapterCatalog", None)  # added by the gateway's branch: checked once merged
    if catalog is not None:
        assert isinstance(source, catalog)


def test_a_wakeable_model_whose_pods_are_starting_is_not_called_scaled_to_zero() -> None:
    """Defect: `/v1/models` showed a merely Pending service (replicas 1, no ready pod yet) as scaled to zero."""
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    for name, replicas in (("waking", 1), ("asleep", 0)):
        body = _isvc(scaleToZeroAfterSeconds=600, replicas=replicas)
        body = {**body, "metadata": {"name": name, "namespace": "ml"}, "spec": {**body["spec"], "model": {}}}
        source.apply_event("isvc", "ADDED", body)
    assert source.listing() == [
        ModelListing(name="asleep", ready=False, scaled_to_zero=True, wakeable=True),
        ModelListing(name="waking", ready=False, scaled_to_zero=False, wakeable=True),
    ]


def test_two_services_with_one_adapter_name_route_it_to_the_one_with_ready_pods() -> None:
    """Defect: the first by name won even when its base had no ready pod."""
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    for name in ("a-first", "b-second"):
        body = _isvc(adapters=[{"name": "sql", "source": f"/adapters/{name}"}])
        body = {**body, "metadata": {"name": name, "namespace": "ml"},
                "spec": {**body["spec"], "model": {"servedName": f"base-{name}"}}}  # fmt: skip
        source.apply_event("isvc", "ADDED", body)
    adapter = source.adapter("sql")
    assert adapter is not None and adapter.base == "base-a-first"  # neither ready: by name, stable
    source.apply_event("slice", "ADDED", _slice("b-second-x", "b-second", ("10.0.0.2", True, "p2")))
    adapter = source.adapter("sql")
    assert adapter is not None and adapter.base == "base-b-second"
    assert [e.url for e in source.endpoints("sql")] == ["http://10.0.0.2:8000"]
