"""Engines in a cluster: InferenceServices and their ready pods, watched through the Kubernetes API.

The operator gives every InferenceService a Service of the same name; the EndpointSlice controller lists
that Service's pods in EndpointSlices (labels copied from the Service, `kubernetes.io/service-name`). This
source watches both kinds and answers with pod-level endpoints, because prefix affinity must pick a pod,
not a Service VIP:

    endpoints(model) = [http://<pod IP>:<port "http"> for every slice address with conditions.ready
                        in every slice of the Service of each InferenceService whose served model is `model`]

A model with no ready pod stays known (a request gets 503, never 404); `/v1/models` offers it only when a
request can wake it: its InferenceService sets `spec.scaleToZeroAfterSeconds` (idle scale-down by the
operator, wake by the gateway through the scale subresource, see `fleetgate.gateway.wake`). Such a model is
listed as `scaled_to_zero` only when one of its services is at `spec.replicas: 0`; one whose pods are merely
starting is listed as neither ready nor scaled to zero (a request is held until a pod is ready).

LoRA adapters (`AdapterCatalog`): `adapters()` lists each InferenceService's `spec.adapters` with base = the
CR's served model, `lora_path` as the pod sees it (`fleetgate.engine.pod_paths`) and `tenant` as the only
tenant allowed. `models()` lists base models only; `endpoints(adapter)` returns its base's endpoints (the
request keeps `model: <adapter>`: vLLM picks the LoRA by it). An adapter is offered while its base is; a name
that is also a served model stays the model. Two services declaring one adapter name: the one whose base
has ready pods wins, then the first by (namespace, name), so the answer is stable between resyncs.

KV-cache events: for an InferenceService with `spec.engine.kvEvents`, each endpoint also carries where its pod
publishes (`kv_events: tcp://<pod IP>:<port "kv-events">`, `kv_events_replay` from port "kv-replay",
`kv_events_topic`), read by the precise prefix scorer.

An InferenceService with `engine.task: embed` serves an encoder: its model is marked as an embedding model
(`task(model)`, the endpoints' `task` label, `/v1/models`), which chat and completions refuse and the semantic
cache finds its encoder service by (`semantic.remote.model`).

Each endpoint carries labels from the CR: `tier`, prices (`price_input_per_1m`, `price_output_per_1m`,
`price_cached_input_per_1m`), `inferenceservice`, `namespace`, `pod`. `start()` lists once (so the first
request after start-up already has endpoints) and then keeps watching; a broken watch is re-listed after
a back-off, and everything is re-listed every `resync_s` anyway. Never imports the operator: shared names
come from `fleetgate.engine.kube_names`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from fleetgate.core.adapters import AdapterSpec, valid_adapter_name
from fleetgate.core.types import LABEL_KV_EVENTS, LABEL_KV_EVENTS_REPLAY, LABEL_KV_EVENTS_TOPIC, Endpoint
from fleetgate.engine.kube_names import (
    ANNOTATION_LAST_REQUEST,
    ANNOTATION_WAKE_REPLICAS,
    ENGINE_PORT,
    ENGINE_PORT_NAME,
    GROUP,
    KIND,
    KV_EVENTS_DEFAULT_TOPIC,
    KV_EVENTS_PORT_NAME,
    KV_REPLAY_PORT_NAME,
    PLURAL,
    SPEC_SCALE_TO_ZERO_AFTER,
    VERSION,
)
from fleetgate.engine.pod_paths import adapter_load_path
from fleetgate.gateway.discovery import ModelListing, WakeTarget
from fleetgate.gateway.discovery.watching import WatchedSource

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from fleetgate.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# Phases in which the operator creates no engine pods: such a model is not offered (unless pods of an
# earlier spec still serve it).
UNSERVABLE_PHASES = frozenset({"DoesNotFit", "Invalid"})
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    namespace: str
    name: str
    served_model: str
    labels: Mapping[str, str] = field(default_factory=dict)
    unservable: bool = False  # the operator will create no pods for it (DoesNotFit, Invalid)
    wake_replicas: int | None = None  # scale-from-zero capable: replicas to wake it to; None: not wakeable
    context_length: int | None = None  # spec.engine.maxModelLen: bounds a request that sets no max_tokens
    adapters: tuple[AdapterSpec, ...] = ()  # spec.adapters, base = served_model
    task: str = "generate"  # spec.engine.task: "embed" for an encoder (the pooling runner, /v1/embeddings)
    scaled_to_zero: bool = False  # spec.replicas is 0 (idle scale-down, or by hand)
    kv_events_topic: str | None = None  # spec.engine.kvEvents.topic when the engines publish KV events; None: off


def _adapters(spec: Mapping[str, Any], *, base: str) -> tuple[AdapterSpec, ...]:
    """spec.adapters as AdapterSpecs; entries the operator would refuse are skipped (never trusted blindly)."""
    raw = spec.get("adapters")
    out: list[AdapterSpec] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict):
            continue
        name, source, rank, tenant = entry.get("name"), entry.get("source"), entry.get("rank"), entry.get("tenant")
        path = adapter_load_path(source=source) if isinstance(source, str) else None
        if not isinstance(name, str) or not valid_adapter_name(name) or name == base or path is None:
            continue
        out.append(
            AdapterSpec(
                name=name, base=base, source=path,
                rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else None,
                tenants=frozenset({tenant}) if isinstance(tenant, str) and tenant else frozenset(),
            )
        )  # fmt: skip
    return tuple(out)


def _wake_replicas(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> int | None:
    """Replicas a request wakes the service to: what the operator scaled down from, else spec.replicas, at least 1."""
    if not spec.get(SPEC_SCALE_TO_ZERO_AFTER):
        return None
    raw = (meta.get("annotations") or {}).get(ANNOTATION_WAKE_REPLICAS) or spec.get("replicas") or 1
    try:
        return max(1, int(raw))
    except (TypeError, ValueError):
        return 1


def service_info(obj: Mapping[str, Any]) -> ServiceInfo | None:
    """What the gateway needs from one InferenceService, or None for a malformed object."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace:
        return None
    model = spec.get("model") or {}
    status = obj.get("status") or {}
    served = status.get("servedModel") or model.get("servedName") or name
    gateway = spec.get("gateway") or {}
    labels = {"inferenceservice": name, "namespace": namespace}
    if gateway.get("tier"):
        labels["tier"] = str(gateway["tier"])
    pricing = gateway.get("pricing") or {}
    for key, label in (
        ("inputPerMillionTokens", "price_input_per_1m"),
        ("outputPerMillionTokens", "price_output_per_1m"),
        ("cachedInputPerMillionTokens", "price_cached_input_per_1m"),
    ):
        if pricing.get(key) is not None:
            labels[label] = str(pricing[key])
    unservable = status.get("phase") in UNSERVABLE_PHASES
    engine = spec.get("engine") or {}
    context = engine.get("maxModelLen")
    task = "embed" if engine.get("task") == "embed" else "generate"
    if task == "embed":
        labels["task"] = task
    replicas = spec.get("replicas")
    kv_events = engine.get("kvEvents")
    return ServiceInfo(
        namespace=namespace, name=name, served_model=str(served), labels=labels, unservable=unservable,
        wake_replicas=None if unservable else _wake_replicas(meta, spec),
        context_length=context if isinstance(context, int) and not isinstance(context, bool) and context > 0
        else None,
        adapters=_adapters(spec, base=str(served)),
        task=task,
        scaled_to_zero=isinstance(replicas, int) and not isinstance(replicas, bool) and replicas == 0,
        kv_events_topic=str(kv_events.get("topic", KV_EVENTS_DEFAULT_TOPIC)) if isinstance(kv_events, dict) else None,
    )  # fmt: skip


def ready_addresses(slice_: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """(ip, port, pod name) of the ready endpoints of one EndpointSlice."""
    port = next((p.get("port") for p in slice_.get("ports") or [] if p.get("name") == ENGINE_PORT_NAME), None)
    port = int(port) if port else ENGINE_PORT
    out: list[tuple[str, int, str]] = []
    for ep in slice_.get("endpoints") or []:
        conditions = ep.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        pod = (ep.get("targetRef") or {}).get("name", "")
        for address in ep.get("addresses") or []:
            out.append((address, port, pod))
    return out


def kv_event_ports(slice_: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The KV-event publisher and replay ports an EndpointSlice names (the operator's `kv-events`, `kv-replay`)."""
    named = {p.get("name"): p.get("port") for p in slice_.get("ports") or [] if isinstance(p, dict)}
    pub, replay = named.get(KV_EVENTS_PORT_NAME), named.get(KV_REPLAY_PORT_NAME)
    return (int(pub) if isinstance(pub, int) else None, int(replay) if isinstance(replay, int) else None)


def kv_event_labels(topic: str | None, host: str, ports: tuple[int | None, int | None]) -> dict[str, str]:
    """Where the pod at `host` publishes KV events, as the precise prefix scorer reads it from labels (also used by
    InferencePool discovery)."""
    pub, replay = ports
    if topic is None or pub is None:
        return {}
    labels = {LABEL_KV_EVENTS: f"tcp://{host}:{pub}", LABEL_KV_EVENTS_TOPIC: topic}
    if replay is not None:
        labels[LABEL_KV_EVENTS_REPLAY] = f"tcp://{host}:{replay}"
    return labels


def build_index(
    *, services: Mapping[tuple[str, str], ServiceInfo], slices: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[str, list[Endpoint]]:
    """served model -> pod endpoints, from the current InferenceServices and EndpointSlices. Pure."""
    by_service: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
    kv_ports: dict[tuple[str, int], tuple[int | None, int | None]] = {}  # (ip, http port) -> KV-event ports
    for (namespace, _slice_name), slice_ in slices.items():
        owner = ((slice_.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
        if owner:
            addresses = ready_addresses(slice_)
            by_service.setdefault((namespace, owner), []).extend(addresses)
            ports = kv_event_ports(slice_)
            kv_ports.update({(ip, port): ports for ip, port, _pod in addresses})
    index: dict[str, list[Endpoint]] = {}
    for key, info in sorted(services.items()):
        for ip, port, pod in sorted(set(by_service.get(key, []))):
            host = f"[{ip}]" if ":" in ip else ip
            kv = kv_event_labels(info.kv_events_topic, host, kv_ports.get((ip, port), (None, None)))
            labels = {**info.labels, "pod": pod, **kv}
            index.setdefault(info.served_model, []).append(
                Endpoint(id=f"{host}:{port}", url=f"http://{host}:{port}", model=info.served_model, labels=labels)
            )
        if not info.unservable:
            index.setdefault(info.served_model, [])
    return index


def adapter_index(
    *, services: Mapping[tuple[str, str], ServiceInfo], models: Mapping[str, Any]
) -> dict[str, AdapterSpec]:
    """adapter name -> AdapterSpec, for adapters whose base is an offered model. Pure.

    A name that is also a model stays the model's; two services naming one adapter: one whose base has
    endpoints (ready pods) first, then by (namespace, name), so the answer never flips between resyncs."""
    out: dict[str, AdapterSpec] = {}

    def order(item: tuple[tuple[str, str], ServiceInfo]) -> tuple[bool, tuple[str, str]]:
        return not models.get(item[1].served_model), item[0]

    for _key, info in sorted(services.items(), key=order):
        if info.served_model not in models:
            continue
        for adapter in info.adapters:
            if adapter.name not in models and adapter.name not in out:
                out[adapter.name] = adapter
    return out


class KubernetesEndpointSource(WatchedSource):
    """An EndpointSource fed by watches on InferenceServices and EndpointSlices."""

    NAME = "kubernetes discovery"
    KINDS = ("isvc", "slice")

    def __init__(
        self,
        *,
        client_factory: Any,
        namespace: str | None,
        label_selector: str,
        resync_s: float = 30.0,
        registry: CollectorRegistry | None = None,
        retry_s: float = 2.0,
    ) -> None:
        super().__init__(client_factory=client_factory, resync_s=resync_s, retry_s=retry_s)
        self._namespace = namespace
        self._selector: dict[str, Any] = dict(p.split("=", 1) for p in label_selector.split(",") if "=" in p)
        self._services: dict[tuple[str, str], ServiceInfo] = {}
        self._slices: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._index: dict[str, list[Endpoint]] = {}
        self._adapter_index: dict[str, AdapterSpec] = {}
        self._gauge = (
            Gauge("fleetgate_discovered_endpoints", "Ready engine pods per model (Kubernetes discovery).", ["model"],
                  registry=registry)
            if registry is not None
            else None
        )  # fmt: skip

    def models(self) -> list[str]:
        return sorted(self._index)

    def endpoints(self, model: str) -> list[Endpoint]:
        """A model's endpoints; an adapter's are its base model's."""
        if model not in self._index:
            adapter = self._adapter_index.get(model)
            model = adapter.base if adapter is not None else model
        return list(self._index.get(model, []))

    def adapters(self) -> list[AdapterSpec]:
        """`AdapterCatalog`: the adapters of every InferenceService whose base model is offered, by name."""
        return [self._adapter_index[name] for name in sorted(self._adapter_index)]

    def adapter(self, name: str) -> AdapterSpec | None:
        """`AdapterLookup`: one dict read (the request path asks several times per request; without it
        `adapter_named` would sort and scan every adapter each time)."""
        return self._adapter_index.get(name)

    def wake_targets(self, model: str) -> list[WakeTarget]:
        return [
            WakeTarget(namespace=info.namespace, name=info.name, replicas=info.wake_replicas)
            for _key, info in sorted(self._services.items())
            if info.served_model == model and info.wake_replicas is not None
        ]

    def context_length(self, model: str) -> int | None:
        """The smallest `maxModelLen` among the services serving `model` (a request may land on any)."""
        known = [
            info.context_length
            for info in self._services.values()
            if info.served_model == model and info.context_length is not None
        ]
        return min(known) if known else None

    def listing(self) -> list[ModelListing]:
        """Models with endpoints, and those without that a request can wake; not those that cannot be served."""
        out = []
        for model in self.models():
            if self._index[model]:
                out.append(ModelListing(name=model, ready=True, task=self.task(model)))
            elif self.wake_targets(model):
                zero = any(i.scaled_to_zero for i in self._services.values() if i.served_model == model)
                out.append(ModelListing(name=model, ready=False, scaled_to_zero=zero, wakeable=True,
                                        task=self.task(model)))
        return out

    def task(self, model: str) -> str:
        """`TaskSource`: "embed" when an InferenceService serves `model` as an encoder (`engine.task: embed`)."""
        embed = any(info.served_model == model and info.task == "embed" for info in self._services.values())
        return "embed" if embed else "generate"

    async def scale(self, target: WakeTarget) -> None:
        """Set `spec.replicas` through the InferenceService's scale subresource."""
        from lightkube.types import PatchType

        assert self._client is not None, "start() first"
        isvc, _slice = self._resources()
        body = {"spec": {"replicas": target.replicas}}
        await self._client.patch(isvc.Scale, target.name, body, namespace=target.namespace, patch_type=PatchType.MERGE)

    async def mark_active(self, model: str) -> None:
        """Stamp the time of a request on the InferenceServices of `model` (read by the idle scale-down)."""
        from lightkube.types import PatchType

        if self._client is None:
            return
        isvc, _slice = self._resources()
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"metadata": {"annotations": {ANNOTATION_LAST_REQUEST: now}}}
        for target in self.wake_targets(model):
            await self._client.patch(isvc, target.name, body, namespace=target.namespace, patch_type=PatchType.MERGE)

    def _rebuild(self) -> None:
        before = set(self._index)
        self._index = build_index(services=self._services, slices=self._slices)
        self._adapter_index = adapter_index(services=self._services, models=self._index)
        if self._gauge is not None:
            for model, eps in self._index.items():
                self._gauge.labels(model=model).set(len(eps))
            for gone in before - set(self._index):  # a deleted model is no longer reported
                with contextlib.suppress(KeyError):
                    self._gauge.remove(gone)

    def _resources(self) -> tuple[Any, Any]:
        from lightkube.core.resource_registry import resource_registry
        from lightkube.generic_resource import create_namespaced_resource
        from lightkube.resources.discovery_v1 import EndpointSlice

        isvc = resource_registry.get(f"{GROUP}/{VERSION}", KIND) or create_namespaced_resource(
            GROUP, VERSION, KIND, PLURAL
        )
        return isvc, EndpointSlice

    def _namespace_arg(self) -> str:
        from lightkube import ALL_NS

        return self._namespace if self._namespace else ALL_NS

    async def relist(self) -> None:
        """Replace the state with a fresh list of both kinds."""
        assert self._client is not None
        isvc, slice_cls = self._resources()
        services: dict[tuple[str, str], ServiceInfo] = {}
        async for obj in self._client.list(isvc, namespace=self._namespace_arg()):
            info = service_info(self._plain(obj))
            if info is not None:
                services[(info.namespace, info.name)] = info
        slices: dict[tuple[str, str], Mapping[str, Any]] = {}
        async for obj in self._client.list(slice_cls, namespace=self._namespace_arg(), labels=self._selector):
            body = self._plain(obj)
            meta = body.get("metadata") or {}
            slices[(meta.get("namespace", ""), meta.get("name", ""))] = body
        self._services, self._slices = services, slices
        self._rebuild()

    def apply_event(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """Fold one watch event into the state (`kind` is "isvc" or "slice")."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "isvc":
            info = service_info(obj)
            if event == "DELETED" or info is None:
                self._services.pop(key, None)
            else:
                self._services[key] = info
        elif event == "DELETED":
            self._slices.pop(key, None)
        else:
            self._slices[key] = obj
        self._rebuild()

    def _watched(self, kind: str) -> tuple[Any, str, dict[str, Any] | None]:
        isvc, slice_cls = self._resources()
        return (isvc, self._namespace_arg(), None) if kind == "isvc" else (slice_cls, self._namespace_arg(),
                                                                           self._selector)


def own_namespace() -> str | None:
    try:
        return SA_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def build_source(settings: GatewaySettings, *, registry: CollectorRegistry) -> KubernetesEndpointSource:
    """The wiring's entry point for `discovery.kind: kubernetes`."""

    def client() -> AsyncClient:
        from lightkube import AsyncClient, KubeConfig

        return AsyncClient(config=KubeConfig.from_env())

    discovery = settings.discovery
    return KubernetesEndpointSource(
        client_factory=client,
        namespace=discovery.namespace or own_namespace(),
        label_selector=discovery.label_selector,
        resync_s=discovery.resync_s,
        registry=registry,
    )
