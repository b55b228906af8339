"""The only code in the operator that talks to the Kubernetes API.

Client: lightkube (async, small, server-side apply built in, in-cluster and kubeconfig auth, watch). Kopf
keeps its own connection for watching InferenceServices; everything the reconciler reads or writes goes
through `KubeApi`, on plain dicts (lightkube's generic resources), so builders and tests never meet
client types. Every method names the (group, resource, verb) it issues; `API_CALLS` is the full list,
and `rbac.py` is tested to grant each one (least privilege, nothing more).

Writes are server-side apply (`PATCH application/apply-patch+yaml`, one field manager, `force=True`: the
operator is the sole owner of its children's fields, and an autoscaler's `replicas` is left out of the
applied Deployment so it is never contested). `merge_patch` (`application/merge-patch+json`, lists replaced
whole) is the fallback for putting back an edit that apply cannot undo (see `Reconciler._restore`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetgate.engine.kube_names import (
    ENGINE_NAME,
    GROUP,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
    PLURAL,
    POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
    VERSION,
)

if TYPE_CHECKING:
    from lightkube import AsyncClient

# (api group, resource, verb) -> kind; the API module issues exactly these calls.
KINDS: Mapping[str, tuple[str, str, str]] = {
    # kind: (group, version, plural)
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ("autoscaling", "v2", "horizontalpodautoscalers"),
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
    "ServiceMonitor": ("monitoring.coreos.com", "v1", "servicemonitors"),
    # Published, not owned (no ownerReference): `fleetgate.operator.pools`; never a `list_children` kind.
    "InferencePool": (POOL_GROUP, POOL_VERSION, POOL_PLURAL),
}
CHILD_VERBS = ("get", "list", "patch", "delete")
API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {(group, plural, verb) for group, _v, plural in KINDS.values() for verb in CHILD_VERBS}
    | {
        (GROUP, PLURAL, "get"),
        (GROUP, PLURAL, "list"),  # other services of the namespace serving the same model (shared_names.py)
        (GROUP, PLURAL, "patch"),  # idle scale-down (operator/idle.py)
        (GROUP, f"{PLURAL}/status", "patch"),
        ("", "events", "create"),
        ("", "pods", "list"),  # runtime LoRA adapters: the ready engine pods to load them into
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("kopf.dev", "clusterkopfpeerings", "get"),
        ("kopf.dev", "clusterkopfpeerings", "create"),
    }
)
PEERING_CRD = "clusterkopfpeerings.kopf.dev"


def resource_class(group: str, version: str, kind: str, plural: str) -> Any:
    """lightkube's class for a kind: the registered one (built-in or generic) or a new generic one.

    lightkube cannot re-create a generic class for the core group (its registry looks it up as "/v1"
    but stores it as "v1"), so the registry is asked first.
    """
    from lightkube.core.exceptions import LoadResourceError
    from lightkube.core.resource_registry import resource_registry
    from lightkube.generic_resource import create_namespaced_resource

    try:
        existing = resource_registry.get(f"{group}/{version}" if group else version, kind)
    except (LoadResourceError, ImportError):
        existing = None
    if existing is not None:
        return existing
    return create_namespaced_resource(group, version, kind, plural)


class ApiCallNotDeclared(RuntimeError):
    """A call missing from API_CALLS: RBAC would not grant it in a cluster."""


def status_code(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


class KubeApi:
    """Typed-by-dict access to the API server for the reconciler."""

    def __init__(self, *, client: AsyncClient, field_manager: str) -> None:
        self._client = client
        self._field_manager = field_manager
        self._resources: dict[str, Any] = {}

    @classmethod
    def from_server(cls, *, url: str, field_manager: str, token: str | None = None) -> KubeApi:
        """A client for an explicit API server URL (tests, envtest); no TLS verification settings."""
        from lightkube import AsyncClient, KubeConfig
        from lightkube.config.models import Cluster, User

        config = KubeConfig.from_one(cluster=Cluster(server=url, insecure=True), user=User(token=token))
        return cls(client=AsyncClient(config=config, field_manager=field_manager), field_manager=field_manager)

    @classmethod
    def from_env(cls, *, field_manager: str) -> KubeApi:
        """In-cluster service account, else $KUBECONFIG / ~/.kube/config."""
        from lightkube import AsyncClient, KubeConfig

        return cls(
            client=AsyncClient(config=KubeConfig.from_env(), field_manager=field_manager), field_manager=field_manager
        )

    async def aclose(self) -> None:
        await self._client.close()

    def _check(self, group: str, resource: str, verb: str) -> None:
        if (group, resource, verb) not in API_CALLS:
            raise ApiCallNotDeclared(f"({group!r}, {resource!r}, {verb!r}) is not in kube.API_CALLS")

    def _resource(self, kind: str) -> Any:
        if kind not in self._resources:
            if kind == "InferenceService":
                self._resources[kind] = resource_class(GROUP, VERSION, kind, PLURAL)
            elif kind == "Event":
                self._resources[kind] = resource_class("", "v1", kind, "events")
            elif kind == "Pod":
                self._resources[kind] = resource_class("", "v1", kind, "pods")
            else:
                group, version, plural = KINDS[kind]
                self._resources[kind] = resource_class(group, version, kind, plural)
        return self._resources[kind]

    @staticmethod
    def _plain(obj: Any) -> dict[str, Any]:
        if obj is None:
            return {}
        return dict(obj) if isinstance(obj, dict) else dict(obj.to_dict())

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply one child manifest; returns the object as stored."""
        from lightkube.types import PatchType

        kind = manifest["kind"]
        group, _version, plural = KINDS[kind]
        self._check(group, plural, "patch")
        meta = manifest["metadata"]
        result = await self._client.patch(
            self._resource(kind),
            meta["name"],
            manifest,
            namespace=meta["namespace"],
            patch_type=PatchType.APPLY,
            field_manager=self._field_manager,
            force=True,
        )
        return self._plain(result)

    async def merge_patch(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a child with its manifest's labels, annotations and body (everything but metadata):
        lists are replaced whole, so list items another manager now owns go too. Returns the stored object."""
        from lightkube.types import PatchType

        kind = manifest["kind"]
        group, _version, plural = KINDS[kind]
        self._check(group, plural, "patch")
        meta = manifest["metadata"]
        body = {key: value for key, value in manifest.items() if key not in ("metadata", "apiVersion", "kind")}
        body["metadata"] = {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {})}
        result = await self._client.patch(
            self._resource(kind), meta["name"], body, namespace=meta["namespace"], patch_type=PatchType.MERGE,
            field_manager=self._field_manager,
        )  # fmt: skip
        return self._plain(result)

    async def list_children(self, *, namespace: str, owner_name: str, kinds: list[str]) -> list[dict[str, Any]]:
        """Children of one InferenceService, found by its labels (ownership is checked by the plan).

        One list call per kind, issued concurrently: reconcile latency is one round trip, not four."""
        selector: dict[str, Any] = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: owner_name}

        async def one(kind: str) -> list[dict[str, Any]]:
            group, version, plural = KINDS[kind]
            self._check(group, plural, "list")
            items = []
            async for obj in self._client.list(self._resource(kind), namespace=namespace, labels=selector):
                item = self._plain(obj)
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", f"{group}/{version}" if group else version)
                items.append(item)
            return items

        results = await asyncio.gather(*(one(kind) for kind in kinds))
        return [item for items in results for item in items]

    async def list_engine_pods(self, *, namespace: str, owner_name: str) -> list[dict[str, Any]]:
        """The engine pods of one InferenceService (the Deployment's selector labels)."""
        self._check("", "pods", "list")
        selector: dict[str, Any] = {LABEL_NAME: ENGINE_NAME, LABEL_INSTANCE: owner_name}
        return [
            self._plain(obj)
            async for obj in self._client.list(self._resource("Pod"), namespace=namespace, labels=selector)
        ]

    async def get_child(self, *, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        group, _version, plural = KINDS[kind]
        self._check(group, plural, "get")
        try:
            return self._plain(await self._client.get(self._resource(kind), name, namespace=namespace))
        except Exception as exc:
            if status_code(exc) == 404:
                return None
            raise

    async def delete_child(self, *, kind: str, namespace: str, name: str) -> None:
        group, _version, plural = KINDS[kind]
        self._check(group, plural, "delete")
        try:
            await self._client.delete(self._resource(kind), name, namespace=namespace)
        except Exception as exc:
            if status_code(exc) != 404:
                raise

    async def get_inference_service(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        self._check(GROUP, PLURAL, "get")
        try:
            return self._plain(await self._client.get(self._resource("InferenceService"), name, namespace=namespace))
        except Exception as exc:
            if status_code(exc) == 404:
                return None
            raise

    async def list_inference_services(self, *, namespace: str) -> list[dict[str, Any]]:
        self._check(GROUP, PLURAL, "list")
        cls = self._resource("InferenceService")
        return [self._plain(obj) async for obj in self._client.list(cls, namespace=namespace)]

    async def patch_inference_service(self, *, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch an InferenceService (idle scale-down: spec.replicas and an annotation)."""
        from lightkube.types import PatchType

        self._check(GROUP, PLURAL, "patch")
        await self._client.patch(
            self._resource("InferenceService"), name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )

    async def patch_status(self, *, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (the whole status the reconciler computed)."""
        from lightkube.types import PatchType

        self._check(GROUP, f"{PLURAL}/status", "patch")
        await self._client.patch(
            self._resource("InferenceService").Status,
            name,
            {"status": status},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def emit_event(
        self, *, owner: dict[str, Any], event_type: str, reason: str, message: str, now: dt.datetime | None = None
    ) -> None:
        """A core/v1 Event on the InferenceService, shown by `kubectl describe`."""
        self._check("", "events", "create")
        meta = owner["metadata"]
        stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event_cls = self._resource("Event")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "InferenceService",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self._field_manager},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._client.create(event_cls.from_dict(body))

    async def ensure_cluster_peering(self, *, name: str) -> tuple[str, dict[str, Any]]:
        """Make sure Kopf's ClusterKopfPeering `name` exists: ("exists" | "created" | "no-crd" | "forbidden",
        the peers registered in it now, identity -> {priority, lifetime, lastseen}).

        Kopf pauses every watch while its peering object is missing, and says so only at DEBUG level, so
        the operator creates the object itself instead of waiting for someone to apply it."""
        from lightkube.generic_resource import create_global_resource

        if not await self.crd_exists(name=PEERING_CRD):
            return "no-crd", {}
        peering = create_global_resource("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings")
        self._check("kopf.dev", "clusterkopfpeerings", "get")
        try:
            found = self._plain(await self._client.get(peering, name))
            return "exists", dict(found.get("status") or {})
        except Exception as exc:
            code = status_code(exc)
            if code == 403:
                return "forbidden", {}
            if code != 404:
                raise
        self._check("kopf.dev", "clusterkopfpeerings", "create")
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        try:
            await self._client.create(peering.from_dict(body))
        except Exception as exc:
            code = status_code(exc)
            if code == 409:  # another replica created it first
                return "exists", {}
            if code == 403:
                return "forbidden", {}
            raise
        return "created", {}

    async def list_inference_pools(self, *, namespace: str) -> list[dict[str, Any]]:
        """The InferencePools of one namespace (the sweep finds those the operator published)."""
        self._check(POOL_GROUP, POOL_PLURAL, "list")
        pools = self._resource("InferencePool")
        return [self._plain(obj) async for obj in self._client.list(pools, namespace=namespace)]

    async def crd_exists(self, *, name: str) -> bool:
        """Whether an optional API (KEDA, Prometheus Operator) is installed."""
        from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

        self._check("apiextensions.k8s.io", "customresourcedefinitions", "get")
        try:
            await self._client.get(CustomResourceDefinition, name)
        except Exception as exc:
            if status_code(exc) in (404, 403):
                return False
            raise
        return True
