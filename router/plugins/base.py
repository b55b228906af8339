"""The plugin interfaces of the scheduler (the Endpoint Picker shape) and what plugins are given.

A plugin is one object; its role(s) follow from the methods it has, as in the Gateway API
Inference Extension: a prefix-affinity plugin is at once producer (hashes the prompt), scorer and
observer (records where the prompt went). Scores are aligned with the endpoint list.

- `Producer.produce(req, cycle, endpoints)`: async I/O before scheduling; failures are logged and
  ignored (fail open).
- `Filter.filter(req, cycle, endpoints) -> endpoints`.
- `Scorer.score(req, cycle, endpoints) -> [score]`, one per endpoint in [0, 1]; the profile clamps
  and multiplies by the scorer's weight.
- `Picker.pick(endpoints, totals) -> [index]`: endpoint indices, best first (the first is used, the
  next is the fallback for one connect-failure retry).
- `Observer.on_start / on_complete`: update plugin state after routing and at completion.
- `FirstTokenObserver.on_first_token`: the engine sent the request's first generated token (its prefill is
  over); called at most once per request, never for a request that failed before any output.
`cycle` is a per-request scratch dict that lives from `pick` until `on_complete`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from fleetgate.core.kvstore import KVStore
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.types import RoutingRequest

CycleState = dict[str, Any]

# Cycle keys one plugin writes for others: endpoint id -> the share (0..1) of the prompt the prefix scorer in the
# profile believes that endpoint holds; and the prompt's token count, where a scorer tokenized it.
CACHED_SHARE = "prefix.cached_share"
PROMPT_TOKENS = "prompt.tokens"


@runtime_checkable
class Producer(Protocol):
    name: str

    async def produce(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class Filter(Protocol):
    name: str

    def filter(self, req: RoutingRequest, cycle: CycleState, endpoints: list[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]: ...


@runtime_checkable
class Picker(Protocol):
    name: str

    def pick(self, endpoints: Sequence[Endpoint], totals: Sequence[float]) -> list[int]: ...


@runtime_checkable
class Observer(Protocol):
    name: str

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None: ...

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None: ...


@runtime_checkable
class FirstTokenObserver(Protocol):
    name: str

    def on_first_token(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None: ...


@runtime_checkable
class Closable(Protocol):
    async def aclose(self) -> None: ...


@runtime_checkable
class Syncable(Protocol):
    async def sync_now(self) -> bool:
        """Run the plugin's share-with-other-replicas sync once (what its background task does every interval);
        True when nothing is shared or the store answered. For driving replicas on a virtual clock, and tests."""
        ...


@runtime_checkable
class Startable(Protocol):
    async def start(self, source: Any) -> None:
        """Begin background work that follows the endpoints `source` lists (`models()`, `endpoints(model)`)."""
        ...


@dataclass(slots=True)
class PluginContext:
    """What a plugin factory is given besides its parameters."""

    state: FleetState
    kvstore: KVStore | None = None
    namespace: str = "default"
    rng: random.Random = field(default_factory=random.Random)
    registry: CollectorRegistry | None = None  # where a plugin registers its own metrics (the router's registry)

    @property
    def clock(self) -> Callable[[], float]:
        return self.state.clock


def param(params: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """Read one plugin parameter with a clear error naming it."""
    value = params.get(key, default)
    if value is None:
        return None
    if kind is bool and not isinstance(value, bool):  # bool("false") is True: take YAML's true/false only
        raise ValueError(f"parameter {key!r} must be true or false, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"parameter {key!r} must be a {kind.__name__}, got {value!r}") from None


def hotspot_guard(
    scores: list[float], endpoints: Sequence[Endpoint], state: FleetState, margin: float | None,
    relative: float | None = None,
) -> None:
    """Fade affinity scores out on hot endpoints, in place: with x_e = load_e - the least load among
    `endpoints` and m = max(margin, relative x that least load) (`relative` None: m = margin),
    score_e *= 1 if x_e <= m, else max(0, 1 - (x_e - m) / m) (`margin` None: off).
    Shared by the affinity scorers (prefix, adapter), so that one hot pod does not draw every request.
    Why `relative`: past saturation every engine carries 60-100 requests and two of them differ by a few at any
    moment, so a fixed margin of 2 fades affinity out on whichever engine is momentarily ahead and the load scorers
    move the prompt's group there and back, duplicating its prefix (issue 24; docs/reports/routing-saturation.md);
    a margin that is a share of the load still fades out a real hotspot (one prompt group drawing much of the
    traffic), whose excess grows with the load too."""
    if margin is None or not any(scores):
        return
    loads = [state.load(e.id) for e in endpoints]
    least = min(loads)
    if relative is not None:
        margin = max(margin, relative * least)
    for i, load in enumerate(loads):
        excess = load - least
        if excess > margin:
            scores[i] *= max(0.0, 1.0 - (excess - margin) / margin)
