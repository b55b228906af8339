"""An in-process Kubernetes API for tests and benchmarks: kmock's emulator plus what the operator relies on.

kmock (by Kopf's author) stores objects as plain JSON and merges patches. Three API-server behaviours are
added here: server-side apply creates a missing object, `generateName` gets a suffix, lists honour
equality-based `labelSelector`s, and `metadata.generation` grows when the spec changes (with a fresh `uid`
on create). Garbage collection through
owner references, admission (CEL) and defaulting are not emulated. kmock is a development dependency:
import this module only from tests and benchmarks.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import kmock
from kmock._internal import enums

RESOURCES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    # "group/version/plural": (kind, namespaced, subresources)
    "fleetgate.io/v1alpha1/inferenceservices": ("InferenceService", True, ("status", "scale")),
    "apps/v1/deployments": ("Deployment", True, ("status", "scale")),
    "v1/services": ("Service", True, ("status",)),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, ("status",)),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True, ("status",)),
    "v1/events": ("Event", True, ()),
    "v1/pods": ("Pod", True, ("status",)),
    "v1/namespaces": ("Namespace", False, ()),
    "discovery.k8s.io/v1/endpointslices": ("EndpointSlice", True, ()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, ()),
}

VERBS = frozenset({"list", "watch", "get", "create", "patch", "delete"})


class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus SSA-creates, generateName and generation bumps (see the module docstring)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._names = itertools.count()
        self._keep_requests: int | None = None

    def keep_requests(self, count: int | None) -> None:
        """Cap the request log. kmock matches each request against views over the whole log, so serving
        costs O(requests so far): fine for a test, quadratic for a benchmark of thousands of calls."""
        self._keep_requests = count

    async def _handle(self, request: Any) -> Any:
        if self._keep_requests is not None and len(self._requests) > self._keep_requests:
            del self._requests[: -self._keep_requests]
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {}) if request.data else {}
            if request.action == enums.action.CREATE and not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._names):05d}"
            if request.action == enums.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
            is_apply = "apply-patch" in (request.headers.get("Content-Type") or "")
            if request.action == enums.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                async with self._lock:
                    exists = key in self._objects and not self._objects[key].deleted
                    if not exists and is_apply:
                        body = dict(request.data)
                        body["metadata"] = {**meta, "uid": str(uuid.uuid4()), "generation": 1}
                        self._objects[key] = body
                        await self._buses[request.resource].put({"type": "ADDED", "object": body})
                    elif exists and "spec" in request.data and not request.url.path.endswith("/status"):
                        current = self._objects[key].raw
                        if current.get("spec") != {**current.get("spec", {}), **request.data["spec"]}:
                            gen = int(current.get("metadata", {}).get("generation") or 1) + 1
                            request.data.setdefault("metadata", {})["generation"] = gen
        return await super()._handle(request)

    async def _serve_list(self, request: Any) -> Any:
        """kmock ignores `labelSelector`; an API server filters by it (lists stay O(matches), not O(all))."""
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector and isinstance(result, dict):
            items = result.get("items") or []
            result["items"] = [i for i in items if _matches((i.get("metadata") or {}).get("labels") or {}, selector)]
        return result


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (`a=b,c==d,e!=f`), the subset the operator and the gateway use."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def new_emulator() -> ApiServerEmulator:
    """An emulator with every resource the operator and the gateway use declared."""
    server = ApiServerEmulator()
    for path, (kind, namespaced, subresources) in RESOURCES.items():
        server.resources[path] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, subresources=subresources, verbs=set(VERBS)
        )
    return server
