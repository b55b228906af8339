"""Where the engines are: the `EndpointSource` protocol and the static source from the config file.

`fleetgate.gateway.discovery.kubernetes` watches the operator's engine pods for `discovery.kind:
kubernetes`; the wiring imports it lazily so the static path never loads a Kubernetes client.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

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
