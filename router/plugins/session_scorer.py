"""Scorer + observer: keep a conversation on the endpoint that served its previous turn.

Input: `RoutingRequest.session_key` (a session header such as `x-session-id`, or the OpenAI `user`
field, as the gateway sets it). Formula: score_e = 1 if e served this session last, else 0;
requests without a session key score 0 everywhere (no effect). State: session -> endpoint, an LRU
of at most `maxSessions` entries (default 100,000), local to this gateway replica (prefix affinity
covers the shared case: a conversation's history is its own prefix). The table holds a 16-byte BLAKE2b
digest of each session key, never the key itself, so its memory is bounded by `maxSessions` whatever
clients send as `user` or `x-session-id` (a 1 MB key costs 16 bytes).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.types import RoutingRequest


def session_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class SessionAffinityScorer:
    def __init__(self, *, name: str, max_sessions: int = 100_000) -> None:
        if max_sessions <= 0:
            raise ValueError("maxSessions must be positive")
        self.name = name
        self.max_sessions = max_sessions
        self._last: OrderedDict[bytes, str] = OrderedDict()

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        target = self._last.get(session_digest(req.session_key)) if req.session_key else None
        return [1.0 if e.id == target else 0.0 for e in endpoints]

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        if not req.session_key:
            return
        digest = session_digest(req.session_key)
        self._last[digest] = endpoint.id
        self._last.move_to_end(digest)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        return None


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> SessionAffinityScorer:
    return SessionAffinityScorer(name=name, max_sessions=param(parameters, "maxSessions", 100_000, int))
