"""Filter: keep endpoints that serve the request's concrete model.

Input: `Endpoint.model` and `RoutingRequest.model`. Formula: keep e if e.model == req.model.
Not in the default profile: the gateway already passes exactly the model's endpoints, and an
endpoint's served name may differ from the public model name (`served_name`). Use it where one
candidate list mixes models whose served names equal the request's model. A LoRA adapter request
(`req.adapter` set) keeps every candidate: the gateway passes its base model's endpoints, which serve
the base's name, never the adapter's. Parameters: none.
"""

from __future__ import annotations

from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.plugins.base import CycleState, PluginContext
from fleetgate.router.types import RoutingRequest


class ServesModelFilter:
    def __init__(self, *, name: str) -> None:
        self.name = name

    def filter(self, req: RoutingRequest, cycle: CycleState, endpoints: list[Endpoint]) -> list[Endpoint]:
        if req.adapter is not None:
            return endpoints
        return [e for e in endpoints if e.model == req.model]


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> ServesModelFilter:
    return ServesModelFilter(name=name)
