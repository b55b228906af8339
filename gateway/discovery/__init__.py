"""Where the engines are: the `EndpointSource` protocol and the static source from the config file.

`fleetgate.gateway.discovery.kubernetes` watches the operator's engine pods for `discovery.kind:
kubernetes`; the wiring imports it lazily so the static path never loads a Kubernetes client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import orjson

from fleetgate.core.types import Endpoint
from fleetgate.gateway.settings import ModelRoute


@runtime_checkable
class EndpointSource(Protocol):
    """Concrete models and their endpoints. May also define `async start()` and `async aclose()`,
    which the app's lifespan calls."""

    def models(self) -> list[str]: ...

    def endpoints(self, model: str) -> list[Endpoint]:
        """Endpoints that serve `model`; an empty list for an unknown model."""
        ...


@dataclass(frozen=True, kw_only=True)
class ModelListing:
    """One model offered by `/v1/models`: ready (it has endpoints) or scaled to zero (a request wakes it)."""

    name: str
    ready: bool
    scaled_to_zero: bool = False


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
    """What the source knows of `model`'s context length (None: unknown)."""
    return source.context_length(model) if isinstance(source, ContextSource) else None


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
    """The models `/v1/models` offers: the source's own listing, else every known model."""
    if isinstance(source, ListingSource):
        return source.listing()
    return [ModelListing(name=m, ready=bool(source.endpoints(m))) for m in source.models()]


def models_page(source: EndpointSource, *, aliases: list[str], allowed: frozenset[str] | set[str] | None) -> bytes:
    """The `/v1/models` body: only what a client can be served (models with endpoints or that a request
    wakes, and aliases), limited to the tenant's `allowed` models; an extra `fleetgate` field per model says
    whether it is ready or scaled to zero (OpenAI clients ignore unknown fields)."""
    offered = [(m.name, {"ready": m.ready, "scaled_to_zero": m.scaled_to_zero}) for m in listing(source)]
    offered += [(alias, {"ready": True, "scaled_to_zero": False}) for alias in aliases]
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "fleetgate", "fleetgate": state}
        for name, state in offered
        if allowed is None or name in allowed
    ]
    return orjson.dumps({"object": "list", "data": data})


def endpoint_id(url: str) -> str:
    """A short stable id for a base URL: host:port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


class StaticEndpointSource:
    """The `models:` list of the config file, fixed for the life of the process."""

    def __init__(self, routes: list[ModelRoute]) -> None:
        self._by_model: dict[str, list[Endpoint]] = {
            r.name: [
                Endpoint(id=endpoint_id(url), url=url, model=r.served_name or r.name) for url in r.endpoints
            ]
            for r in routes
        }
        self._names = list(self._by_model)

    def models(self) -> list[str]:
        return list(self._names)

    def endpoints(self, model: str) -> list[Endpoint]:
        return self._by_model.get(model, [])
