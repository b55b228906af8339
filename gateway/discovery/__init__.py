"""Where the engines are: the `EndpointSource` protocol and the static source from the config file.

`fleetgate.gateway.discovery.kubernetes` watches the operator's engine pods for `discovery.kind:
kubernetes`; the wiring imports it lazily so the static path never loads a Kubernetes client.

LoRA adapters: a source that knows them also implements `AdapterCatalog`. `models()` keeps listing the
base (concrete) models; an adapter's name is a model name clients send, and `endpoints(adapter)` returns
its base model's endpoints (the forwarded request keeps `model: <adapter>`, which is how vLLM picks the
LoRA). Code that needs "every name a client may ask for" uses `served_names`, which tolerates a source
whose `models()` lists adapters too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import orjson

from fleetgate.core.adapters import AdapterSpec
from fleetgate.core.types import LABEL_KV_EVENTS, LABEL_KV_EVENTS_REPLAY, LABEL_KV_EVENTS_TOPIC, Endpoint
from fleetgate.gateway.settings import ModelRoute


@runtime_checkable
class EndpointSource(Protocol):
    """Concrete models and their endpoints. May also define `async start()` and `async aclose()`,
    which the app's lifespan calls."""

    def models(self) -> list[str]: ...

    def endpoints(self, model: str) -> list[Endpoint]:
        """Endpoints that serve `model`; an empty list for an unknown model."""
        ...


@runtime_checkable
class AdapterCatalog(Protocol):
    def adapters(self) -> list[AdapterSpec]:
        """The LoRA adapters clients may ask for, each with the base model whose endpoints serve it."""
        ...


@runtime_checkable
class AdapterLookup(Protocol):
    def adapter(self, name: str) -> AdapterSpec | None:
        """The adapter called `name`, if any: an optional fast path of an `AdapterCatalog` (the request path
        asks it several times per request)."""
        ...


# These run several times per request: `getattr` instead of `isinstance` on the runtime-checkable protocols,
# which costs ~10 µs a call on CPython 3.12.
def adapters_of(source: EndpointSource) -> list[AdapterSpec]:
    """The source's adapters (none for a source that knows no adapters)."""
    adapters = getattr(source, "adapters", None)
    return list(adapters()) if callable(adapters) else []


def adapter_named(source: EndpointSource, name: str) -> AdapterSpec | None:
    """The adapter clients call `name`, if `name` is an adapter (never a base model of the source)."""
    lookup = getattr(source, "adapter", None)
    if callable(lookup):
        spec: AdapterSpec | None = lookup(name)
        return spec
    for spec in adapters_of(source):
        if spec.name == name:
            return spec
    return None


def serves(source: EndpointSource, name: str) -> bool:
    """Whether `name` is a model or an adapter of the source."""
    return name in source.models() or adapter_named(source, name) is not None


def served_names(source: EndpointSource, *, visible_to: str | None = None) -> list[str]:
    """Every name a client may ask a source for: its models, then its adapters (each once); with `visible_to`
    (a tenant id), without the adapters restricted to other tenants."""
    adapters = [a.name for a in adapters_of(source) if visible_to is None or not a.tenants or visible_to in a.tenants]
    return list(dict.fromkeys([*source.models(), *adapters]))


@dataclass(frozen=True, kw_only=True)
class ModelListing:
    """One model offered by `/v1/models`: ready (it has endpoints) or scaled to zero (a request wakes it)."""

    name: str
    ready: bool
    scaled_to_zero: bool = False
    wakeable: bool = False  # no ready pod, but a request is held until one is (scaled to zero, or starting)
    parent: str | None = None  # a LoRA adapter: its base model (vLLM's `/v1/models` says the same)


@dataclass(frozen=True, kw_only=True)
class WakeTarget:
    """An InferenceService to scale up to `replicas` when its model is asked for while scaled to zero."""

    namespace: str
    name: str
    replicas: int = 1


@runtime_checkable
class ListingSource(Protocol):
    def listing(self) -> list[ModelListing]:
        """The known models a client can be served: with endpoints, or able to be woken."""
        ...


@runtime_checkable
class ContextSource(Protocol):
    def context_length(self, model: str) -> int | None:
        """The model's context length (prompt + output tokens) as its engines are configured, if known."""
        ...


def context_length(source: EndpointSource, model: str) -> int | None:
    """What the source knows of `model`'s context length (None: unknown); an adapter has its base's.

    Per request: `getattr`, not `isinstance` against the runtime-checkable protocol, which walks the
    protocol's members each time (~2% of a cached lookup's CPU in `fleetgate bench gateway`)."""
    lookup = getattr(source, "context_length", None)
    if lookup is None:
        return None
    spec = adapter_named(source, model)
    known: int | None = lookup(spec.base if spec is not None else model)
    return known


@runtime_checkable
class WakeableSource(Protocol):
    def wake_targets(self, model: str) -> list[WakeTarget]:
        """What to scale up for `model` when it has no endpoint; empty when it cannot be woken."""
        ...

    async def scale(self, target: WakeTarget) -> None:
        """Set the target's replicas (the scale subresource); raises on failure."""
        ...

    async def mark_active(self, model: str) -> None:
        """Record that `model` was asked for (the operator's idle scale-down reads it)."""
        ...


def listing(source: EndpointSource) -> list[ModelListing]:
    """The models `/v1/models` offers: the source's own listing (else every known model), then each adapter
    whose base is servable (ready, or held and woken by a request), in the base's state."""
    adapter_names = {a.name for a in adapters_of(source)}
    if isinstance(source, ListingSource):
        bases = [m for m in source.listing() if m.name not in adapter_names]
    else:
        names = [m for m in source.models() if m not in adapter_names]
        bases = [ModelListing(name=m, ready=bool(source.endpoints(m))) for m in names]
    by_name = {m.name: m for m in bases}
    out = list(bases)
    for spec in adapters_of(source):
        base = by_name.get(spec.base)
        if base is not None and (base.ready or base.scaled_to_zero or base.wakeable):
            out.append(ModelListing(name=spec.name, ready=base.ready, scaled_to_zero=base.scaled_to_zero,
                                    wakeable=base.wakeable, parent=spec.base))
    return out


def _visible(entry: ModelListing, *, tenant: str | None, allowed: frozenset[str] | set[str] | None,
             restricted: dict[str, frozenset[str]]) -> bool:
    if allowed is not None and entry.name not in allowed:
        return False
    only = restricted.get(entry.name)
    return not only or tenant in only


def models_page(
    source: EndpointSource, *, aliases: list[str], allowed: frozenset[str] | set[str] | None, tenant: str | None = None
) -> bytes:
    """The `/v1/models` body: only what a client can be served (models with endpoints or that a request
    wakes, their adapters with `parent` = the base, and aliases), limited to the tenant's `allowed` models and
    to adapters that name no tenants or name `tenant`; an extra `fleetgate` field per model says whether it is
    ready or scaled to zero (OpenAI clients ignore unknown fields)."""
    restricted = {a.name: a.tenants for a in adapters_of(source) if a.tenants}
    offered = [m for m in listing(source) if _visible(m, tenant=tenant, allowed=allowed, restricted=restricted)]
    offered += [ModelListing(name=a, ready=True) for a in aliases if allowed is None or a in allowed]
    data: list[dict[str, object]] = []
    for m in offered:
        entry: dict[str, object] = {"id": m.name, "object": "model", "created": 0, "owned_by": "fleetgate"}
        if m.parent is not None:
            entry["parent"] = m.parent
        entry["fleetgate"] = {"ready": m.ready, "scaled_to_zero": m.scaled_to_zero}
        data.append(entry)
    return orjson.dumps({"object": "list", "data": data})


def endpoint_id(url: str) -> str:
    """A short stable id for a base URL: host:port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _kv_labels(route: ModelRoute, url: str) -> dict[str, str]:
    """The labels that tell the precise prefix scorer where the engine at `url` publishes KV events."""
    entry = route.kv_events_of(url)
    if entry is None:
        return {}
    labels = {LABEL_KV_EVENTS: entry.publisher, LABEL_KV_EVENTS_TOPIC: entry.topic}
    if entry.replay:
        labels[LABEL_KV_EVENTS_REPLAY] = entry.replay
    return labels


class StaticEndpointSource:
    """The `models:` list of the config file, fixed for the life of the process; its adapters are each
    route's `adapters:` (an `AdapterCatalog`)."""

    def __init__(self, routes: list[ModelRoute]) -> None:
        self._by_model: dict[str, list[Endpoint]] = {
            r.name: [
                Endpoint(id=endpoint_id(url), url=url, model=r.served_name or r.name, labels=_kv_labels(r, url))
                for url in r.endpoints
            ]
            for r in routes
        }
        self._names = list(self._by_model)
        self._adapters = [a.spec(base=r.name) for r in routes for a in r.adapters]
        self._by_adapter = {a.name: a for a in self._adapters}

    def models(self) -> list[str]:
        return list(self._names)

    def adapters(self) -> list[AdapterSpec]:
        return list(self._adapters)

    def adapter(self, name: str) -> AdapterSpec | None:
        return self._by_adapter.get(name)

    def endpoints(self, model: str) -> list[Endpoint]:
        spec = self._by_adapter.get(model)
        return self._by_model.get(spec.base if spec is not None else model, [])
