"""Engines of Gateway API Inference Extension `InferencePool`s: the pools' selectors and target ports over pods.

`discovery.kind: inferencepool` (the Endpoint Picker's usual source; the gateway can use it too). Watched in
`discovery.namespace` (default: the pod's own): the InferencePools (`inference.networking.k8s.io/v1`; one
named pool with `discovery.pool`, else every pool of the namespace) and the Pods. Then, per pool:

    model(pool)     = annotation `fleetgate.io/served-model` (FleetGate's operator writes it), else the pool's name
    endpoints(model) = [http://<pod IP>:<target port> for every targetPort of every pool of that model,
                        for every pod of the pool's namespace that matches spec.selector.matchLabels,
                        has an IP, is Ready and is not being deleted]

as the Inference Extension's implementer guide describes ("tracking InferencePool endpoints separately"): the
pool's selector picks pods, not a Service. A pool with no ready pod stays known (a request gets 503, never 404).
Each endpoint is labelled `inferencepool`, `namespace` and `pod`; on a pool annotated
`fleetgate.io/kv-events-topic` (the operator's, for `engine.kvEvents`) also with where its pod publishes KV-cache
events for the precise prefix scorer (`kv_events: tcp://<pod IP>:<container port "kv-events">`, the replay address
from port "kv-replay", the topic), as Kubernetes discovery does from EndpointSlices. Pods are watched with
`discovery.pod_label_selector` when set (fewer events in a busy namespace), else all pods of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from fleetgate.core.types import Endpoint
from fleetgate.engine.kube_names import (
    ANNOTATION_KV_EVENTS_TOPIC,
    ANNOTATION_SERVED_MODEL,
    KV_EVENTS_PORT_NAME,
    KV_REPLAY_PORT_NAME,
    POOL_GROUP,
    POOL_KIND,
    POOL_PLURAL,
    POOL_VERSION,
)
from fleetgate.gateway.discovery.kubernetes import kv_event_labels
from fleetgate.gateway.discovery.watching import WatchedSource

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from fleetgate.gateway.settings import GatewaySettings



@dataclass(frozen=True, kw_only=True)
class PoolInfo:
    namespace: str
    name: str
    model: str
    selector: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()
    kv_events_topic: str | None = None  # the pods publish KV-cache events on this topic; None: not announced


def pool_info(obj: Mapping[str, Any]) -> PoolInfo | None:
    """What discovery needs from one InferencePool, or None for one it cannot use (no selector, no port)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    labels = (spec.get("selector") or {}).get("matchLabels")
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or []
                  if isinstance(p, dict) and isinstance(p.get("number"), int) and 0 < p["number"] < 65536)
    if not name or not namespace or not isinstance(labels, dict) or not labels or not ports:
        return None  # an empty selector would take every pod of the namespace: never
    annotations = meta.get("annotations") or {}
    model = annotations.get(ANNOTATION_SERVED_MODEL) or name
    topic = annotations.get(ANNOTATION_KV_EVENTS_TOPIC)
    return PoolInfo(namespace=namespace, name=name, model=str(model),
                    selector={str(k): str(v) for k, v in labels.items()}, ports=ports,
                    kv_events_topic=str(topic) if topic is not None else None)


def ready_pod(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, str]] | None:
    """(pod name, IP, labels) of a pod that can serve, else None."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp"):
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return (str(meta.get("name", "")), str(ip), meta.get("labels") or {}) if ready else None


def kv_event_ports(obj: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The pod's container ports named `kv-events` and `kv-replay` (the operator names them for engine.kvEvents)."""
    named = {p.get("name"): p.get("containerPort") for c in (obj.get("spec") or {}).get("containers") or []
             if isinstance(c, dict) for p in c.get("ports") or [] if isinstance(p, dict)}
    pub, replay = named.get(KV_EVENTS_PORT_NAME), named.get(KV_REPLAY_PORT_NAME)
    return (pub if isinstance(pub, int) else None, replay if isinstance(replay, int) else None)


def build_pool_index(
    *, pools: Mapping[tuple[str, str], PoolInfo], pods: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[str, list[Endpoint]]:
    """model -> endpoints, from the current pools and pods. Pure."""
    index: dict[str, list[Endpoint]] = {}
    for _key, pool in sorted(pools.items()):
        found = index.setdefault(pool.model, [])
        for (namespace, _name), obj in sorted(pods.items()):
            if namespace != pool.namespace:
                continue
            serving = ready_pod(obj)
            if serving is None:
                continue
            pod, ip, labels = serving
            if any(labels.get(k) != v for k, v in pool.selector.items()):
                continue
            host = f"[{ip}]" if ":" in ip else ip
            for port in pool.ports:
                labels_out = {"inferencepool": pool.name, "namespace": namespace, "pod": pod,
                              **kv_event_labels(pool.kv_events_topic, host, kv_event_ports(obj))}
                found.append(Endpoint(id=f"{host}:{port}", url=f"http://{host}:{port}", model=pool.model,
                                      labels=labels_out))
    for model, endpoints in index.items():
        index[model] = list({e.id: e for e in endpoints}.values())  # two pools selecting one pod: once
    return index


class InferencePoolSource(WatchedSource):
    """An EndpointSource fed by watches on InferencePools and Pods."""

    NAME = "inferencepool discovery"
    KINDS = ("pool", "pod")

    def __init__(
        self, *, client_factory: Any, namespace: str, pool: str | None = None, pod_label_selector: str = "",
        resync_s: float = 30.0, registry: CollectorRegistry | None = None, retry_s: float = 2.0,
    ) -> None:
        super().__init__(client_factory=client_factory, resync_s=resync_s, retry_s=retry_s)
        self._namespace = namespace
        self._pool = pool
        self._pod_selector: dict[str, Any] = dict(p.split("=", 1) for p in pod_label_selector.split(",") if "=" in p)
        self._pools: dict[tuple[str, str], PoolInfo] = {}
        self._pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._index: dict[str, list[Endpoint]] = {}
        self._gauge = (Gauge("fleetgate_pool_endpoints", "Ready pods x target ports per model (InferencePool "
                             "discovery).", ["model"], registry=registry) if registry is not None else None)

    def models(self) -> list[str]:
        return sorted(self._index)

    def endpoints(self, model: str) -> list[Endpoint]:
        return list(self._index.get(model, []))

    def pools(self) -> list[PoolInfo]:
        return [self._pools[k] for k in sorted(self._pools)]

    @staticmethod
    def _resource() -> Any:
        from lightkube.core.resource_registry import resource_registry
        from lightkube.generic_resource import create_namespaced_resource

        return resource_registry.get(f"{POOL_GROUP}/{POOL_VERSION}", POOL_KIND) or create_namespaced_resource(
            POOL_GROUP, POOL_VERSION, POOL_KIND, POOL_PLURAL)

    def _wanted(self, info: PoolInfo | None) -> bool:
        return info is not None and (self._pool is None or info.name == self._pool)

    def _rebuild(self) -> None:
        before = set(self._index)
        self._index = build_pool_index(pools=self._pools, pods=self._pods)
        if self._gauge is not None:
            for model, eps in self._index.items():
                self._gauge.labels(model=model).set(len(eps))
            for gone in before - set(self._index):
                self._gauge.remove(gone)

    async def relist(self) -> None:
        from lightkube.resources.core_v1 import Pod

        assert self._client is not None
        pools: dict[tuple[str, str], PoolInfo] = {}
        async for obj in self._client.list(self._resource(), namespace=self._namespace):
            info = pool_info(self._plain(obj))
            if info is not None and self._wanted(info):
                pools[(info.namespace, info.name)] = info
        pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        async for obj in self._client.list(Pod, namespace=self._namespace, labels=self._pod_selector or None):
            body = self._plain(obj)
            meta = body.get("metadata") or {}
            pods[(meta.get("namespace", ""), meta.get("name", ""))] = body
        self._pools, self._pods = pools, pods
        self._rebuild()

    def apply_event(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """Fold one watch event into the state (`kind` is "pool" or "pod")."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "pool":
            info = pool_info(obj)
            if event == "DELETED" or not self._wanted(info):
                self._pools.pop(key, None)
            else:
                assert info is not None
                self._pools[key] = info
        elif event == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = obj
        self._rebuild()

    def _watched(self, kind: str) -> tuple[Any, str, dict[str, Any] | None]:
        from lightkube.resources.core_v1 import Pod

        if kind == "pool":
            return self._resource(), self._namespace, None
        return Pod, self._namespace, self._pod_selector or None


def build_source(settings: GatewaySettings, *, registry: CollectorRegistry) -> InferencePoolSource:
    """The wiring's entry point for `discovery.kind: inferencepool`."""
    from fleetgate.gateway.discovery.kubernetes import own_namespace

    def client() -> AsyncClient:
        from lightkube import AsyncClient, KubeConfig

        return AsyncClient(config=KubeConfig.from_env())

    discovery = settings.discovery
    return InferencePoolSource(client_factory=client, namespace=discovery.namespace or own_namespace() or "default",
                               pool=discovery.pool, pod_label_selector=discovery.pod_label_selector,
                               resync_s=discovery.resync_s, registry=registry)
