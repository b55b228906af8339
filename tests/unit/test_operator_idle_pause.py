"""Idle scale-down pauses with the operator: a peer with a higher or equal priority stops it, as Kopf stops
its own handlers (the idle task runs outside Kopf, so it must check for itself)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetgate.operator.handlers import _outranked
from fleetgate.operator.idle import IdleWatch

OLD = "2026-11-24T10:00:00Z"
IDLE = {"metadata": {"name": "q", "namespace": "default", "creationTimestamp": OLD,
                     "annotations": {"fleetgate.io/last-request": OLD}},
        "spec": {"replicas": 2, "scaleToZeroAfterSeconds": 600}}


class FakeApi:
    def __init__(self, peers: dict[str, Any] | None = None, state: str = "exists") -> None:
        self.peers = peers or {}
        self.state = state
        self.patches: list[dict[str, Any]] = []

    async def ensure_cluster_peering(self, *, name: str) -> tuple[str, dict[str, Any]]:
        return self.state, self.peers

    async def get_inference_service(self, *, namespace: str, name: str) -> dict[str, Any]:
        return IDLE

    async def patch_inference_service(self, *, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)

    async def emit_event(self, **_: Any) -> None:
        pass


def peer(priority: int, *, seconds_ago: int = 5) -> dict[str, Any]:
    seen = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": 60, "lastseen": seen.isoformat()}


async def test_a_paused_watch_scales_nothing_and_an_active_one_does() -> None:
    for paused, expected in ((True, 0), (False, 1)):
        api = FakeApi()

        async def is_paused(value: bool = paused) -> bool:
            return value

        watch = IdleWatch(api=api, interval_s=30, paused=is_paused)  # type: ignore[arg-type]
        watch.track(IDLE)
        await watch.tick()
        assert len(api.patches) == expected


async def test_outranked_by_a_live_peer_of_higher_or_equal_priority_but_never_by_itself() -> None:
    async def outranked(peers: dict[str, Any], state: str = "exists") -> bool:
        return await _outranked(api=FakeApi(peers, state), name="fleetgate", priority=0,  # type: ignore[arg-type]
                                identity="me")

    assert not await outranked({"me": peer(0)})  # itself
    assert await outranked({"me": peer(0), "other": peer(100)})
    assert await outranked({"me": peer(0), "twin": peer(0)})  # Kopf pauses both on equal priority
    assert not await outranked({"me": peer(0), "low": peer(-5)})
    assert not await outranked({"me": peer(0), "gone": peer(100, seconds_ago=600)})  # dead peer
    assert not await outranked({"other": peer(100)}, state="no-crd")  # standalone: nothing to pause for
