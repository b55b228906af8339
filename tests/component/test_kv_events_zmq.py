"""The KV-event subscriber against a publisher that speaks vLLM's ZMQ protocol, with the faults it must survive:
late join, dropped messages (with and without a replay ring that still has them), garbage on the wire, engine
restarts and a publisher that goes away. Loopback only: ZMQ ipc sockets in a private temporary directory."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zmq.asyncio

from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent
from fleetgate.router.kv_subscriber import COALESCE_S, EndpointKvState, KvEventSource, KvEventSubscriber
from fleetgate.sim.kv_publisher import FakeKvPublisher

from .conftest import eventually

BS = 4


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))  # ipc paths must stay short (~100 bytes)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


class Engine:
    """A fake engine's block bookkeeping: publishes what it stores and evicts, keeps the truth for comparison."""

    def __init__(self, publisher: FakeKvPublisher, seed: int) -> None:
        self.publisher = publisher
        self.rng = random.Random(seed)
        self.truth = EndpointBlocks()
        self.chains: dict[tuple[int, ...], int] = {}  # token prefix -> this engine's hash of its last block

    def stored(self, tokens: list[int]) -> list[KvEvent]:
        """The BlockStored event for the blocks of `tokens` this engine does not hold yet."""
        n = len(tokens) // BS
        parent: int | None = None
        new: list[int] = []
        start = None
        for i in range(n):
            key = tuple(tokens[: (i + 1) * BS])
            if key in self.chains:
                parent = self.chains[key]
                continue
            start = i if start is None else start
            self.chains[key] = self.rng.getrandbits(64)
            new.append(self.chains[key])
        if start is None:
            return []
        return [BlockStored(block_hashes=tuple(new), parent_block_hash=parent,
                            token_ids=tuple(tokens[start * BS:n * BS]), block_size=BS, medium="GPU", group_idx=0,
                            spec_kind="full_attention")]

    async def send(self, events: list[KvEvent], *, deliver: bool = True) -> None:
        self.truth.apply(EventBatch(ts=0.0, events=tuple(events)))
        await self.publisher.publish(events, deliver=deliver)

    async def store(self, tokens: list[int], *, deliver: bool = True) -> None:
        await self.send(self.stored(tokens), deliver=deliver)

    async def evict(self, tokens: list[int], *, deliver: bool = True) -> None:
        """Drop the last block of `tokens` (vLLM evicts a chain's tail first)."""
        key = tuple(tokens[: (len(tokens) // BS) * BS])
        engine_hash = self.chains.pop(key)
        await self.send([BlockRemoved(block_hashes=(engine_hash,), medium="GPU", group_idx=0)], deliver=deliver)


def prompt(seed: int, blocks: int = 6) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(blocks * BS)]


def same(state: EndpointKvState, truth: EndpointBlocks) -> bool:
    return state.blocks.held == truth.held


async def follow(ctx: zmq.asyncio.Context, source: KvEventSource, *, coalesce_s: float = COALESCE_S
                 ) -> tuple[KvEventSubscriber, EndpointKvState]:
    state = EndpointKvState(stale_s=5.0)
    sub = KvEventSubscriber(name="e0", source=source, state=state, context=ctx, replay_timeout_s=0.5,
                            coalesce_s=coalesce_s)
    sub.start()
    assert await eventually(lambda: state.usable()), state.reason()
    return sub, state


async def test_events_build_the_block_set_and_a_late_subscriber_replays_history(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    pub = await FakeKvPublisher(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r").start()
    engine = Engine(pub, seed=1)
    try:
        for i in range(5):  # published before anyone listens: only the replay ring has them
            await engine.store(prompt(i))
        await engine.evict(prompt(2))
        sub, state = await follow(zctx, KvEventSource(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r"))
        assert await eventually(lambda: same(state, engine.truth)), (len(state.blocks), len(engine.truth))
        await engine.store(prompt(2, blocks=8))  # extends a known chain: the parent is mapped, so it is hashed
        await engine.send([])
        assert await eventually(lambda: same(state, engine.truth))
        assert state.blocks.match(token_block_hashes(prompt(2, blocks=8), block_size=BS)) == 8
        assert state.stats.gaps == 0 and state.stats.decode_errors == 0 and pub.replays == 1
        await sub.aclose()
    finally:
        await pub.stop()


async def test_dropped_messages_are_recovered_from_the_replay_ring(sockdir: Path, zctx: zmq.asyncio.Context) -> None:
    pub = await FakeKvPublisher(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r").start()
    engine = Engine(pub, seed=2)
    try:
        sub, state = await follow(zctx, KvEventSource(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r"))
        await engine.store(prompt(1))
        await engine.store(prompt(2), deliver=False)  # the PUB socket dropped these two
        await engine.evict(prompt(1), deliver=False)
        await engine.store(prompt(3))
        assert await eventually(lambda: same(state, engine.truth))
        assert state.stats.gaps == 1 and state.usable()
        assert state.blocks.match(token_block_hashes(prompt(1), block_size=BS)) == 5  # the removal was replayed
        await sub.aclose()
    finally:
        await pub.stop()


async def test_a_gap_the_ring_no_longer_holds_never_leaves_a_removed_block_claimed(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    pub = await FakeKvPublisher(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r", buffer_steps=2).start()
    engine = Engine(pub, seed=3)
    try:
        sub, state = await follow(zctx, KvEventSource(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r"))
        await engine.store(prompt(1))
        await engine.send([])
        assert await eventually(lambda: same(state, engine.truth))
        await engine.evict(prompt(1), deliver=False)  # lost, and pushed out of the 2-batch ring below
        for i in (4, 5):
            await engine.store(prompt(i), deliver=False)
        await engine.store(prompt(6))
        assert await eventually(lambda: state.stats.gaps == 1 and state.synced)
        held = state.blocks.held
        assert set(held) <= set(engine.truth.held)  # a subset of the truth: nothing removed is claimed
        assert state.blocks.match(token_block_hashes(prompt(1), block_size=BS)) < 6
        assert state.blocks.match(token_block_hashes(prompt(6), block_size=BS)) == 6
        await sub.aclose()
    finally:
        await pub.stop()


async def test_without_a_replay_ring_a_gap_clears_and_following_goes_on(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    pub = await FakeKvPublisher(publisher=f"ipc://{sockdir}/p").start()
    engine = Engine(pub, seed=4)
    try:
        sub, state = await follow(zctx, KvEventSource(publisher=f"ipc://{sockdir}/p"))
        await engine.store(prompt(1))
        await engine.send([])
        assert await eventually(lambda: len(state.blocks) == 6)
        await engine.evict(prompt(1), deliver=False)
        await engine.store(prompt(7))
        assert await eventually(lambda: state.stats.gaps == 1 and len(state.blocks) == 6)
        assert state.blocks.match(token_block_hashes(prompt(1), block_size=BS)) == 0  # cleared at the gap
        assert state.blocks.match(token_block_hashes(prompt(7), block_size=BS)) == 6
        await sub.aclose()
    finally:
        await pub.stop()


async def test_garbage_on_the_wire_is_counted_and_following_continues(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    pub = await FakeKvPublisher(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r").start()
    engine = Engine(pub, seed=5)
    try:
        sub, state = await follow(zctx, KvEventSource(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r"))
        await engine.store(prompt(1))
        await pub.publish_raw(b"\xc1 not msgpack")
        await engine.store(prompt(2))
        assert await eventually(lambda: state.stats.decode_errors == 1 and len(state.blocks) == 6)
        # Cleared at the bad batch (it may have held a removal); what came after is followed.
        assert state.blocks.match(token_block_hashes(prompt(2), block_size=BS)) == 6
        assert state.blocks.match(token_block_hashes(prompt(1), block_size=BS)) == 0
        assert state.usable()
        await sub.aclose()
    finally:
        await pub.stop()


async def test_an_engine_restart_resets_the_set(sockdir: Path, zctx: zmq.asyncio.Context) -> None:
    addresses = {"publisher": f"ipc://{sockdir}/p", "replay": f"ipc://{sockdir}/r"}
    pub = await FakeKvPublisher(**addresses).start()
    engine = Engine(pub, seed=6)
    sub, state = await follow(zctx, KvEventSource(**addresses))
    try:
        await engine.store(prompt(1))
        assert await eventually(lambda: len(state.blocks) == 6)
        await pub.stop()  # the engine dies
        assert await eventually(lambda: not state.connected)
        assert not state.usable() and len(state.blocks) == 0 and state.stats.disconnects == 1
        pub = await FakeKvPublisher(**addresses).start()  # a new engine process: seq from 0, empty cache
        engine = Engine(pub, seed=7)
        assert await eventually(lambda: state.usable(), timeout_s=10)
        await engine.store(prompt(2))
        await engine.send([AllBlocksCleared()])
        await engine.store(prompt(3))
        assert await eventually(lambda: state.blocks.match(token_block_hashes(prompt(3), block_size=BS)) == 6)
        assert state.blocks.match(token_block_hashes(prompt(1), block_size=BS)) == 0
        assert state.blocks.match(token_block_hashes(prompt(2), block_size=BS)) == 0  # AllBlocksCleared
    finally:
        await sub.aclose()
        await pub.stop()


async def test_batches_published_every_step_are_read_a_few_at_a_time_and_all_applied(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    """vLLM publishes a batch per scheduler step: the subscriber reads what queued up once per `coalesce_s`
    instead of waking per batch (the gateway's CPU, issue 24), and still applies every batch, in order."""
    addresses = {"publisher": f"ipc://{sockdir}/p", "replay": f"ipc://{sockdir}/r"}
    pub = await FakeKvPublisher(**addresses).start()
    engine = Engine(pub, seed=9)
    sub, state = await follow(zctx, KvEventSource(**addresses), coalesce_s=0.1)
    try:
        t0 = time.monotonic()
        for i in range(40):
            await engine.store(prompt(100 + i))
            await asyncio.sleep(0.005)
        await engine.evict(prompt(105))
        assert await eventually(lambda: same(state, engine.truth))
        elapsed = time.monotonic() - t0
        assert state.stats.batches == 41 and state.stats.gaps == 0 and state.stats.decode_errors == 0
        assert 1 <= state.stats.wakes <= elapsed / 0.1 + 2, (state.stats.wakes, elapsed)
        assert state.blocks.match(token_block_hashes(prompt(105), block_size=BS)) == 5  # the removal came last
    finally:
        await sub.aclose()
        await pub.stop()


async def test_a_backlog_is_read_on_without_waiting_the_interval(sockdir: Path, zctx: zmq.asyncio.Context) -> None:
    """A burst larger than one drain (256 batches): the rest is read right after, not `coalesce_s` later."""
    addresses = {"publisher": f"ipc://{sockdir}/p", "replay": f"ipc://{sockdir}/r"}
    pub = await FakeKvPublisher(**addresses).start()
    engine = Engine(pub, seed=10)
    sub, state = await follow(zctx, KvEventSource(**addresses), coalesce_s=5.0)
    try:
        for i in range(600):
            await engine.store(prompt(1000 + i, blocks=1))
        assert await eventually(lambda: state.stats.batches == 600, timeout_s=4.0), state.stats.batches
        assert same(state, engine.truth) and state.stats.gaps == 0
    finally:
        await sub.aclose()
        await pub.stop()


def test_the_coalescing_interval_is_checked() -> None:
    with pytest.raises(ValueError, match="coalesce"):
        KvEventSubscriber(name="e0", source=KvEventSource(publisher="ipc:///tmp/x"), state=EndpointKvState(),
                          context=None, coalesce_s=-1)  # type: ignore[arg-type]


async def test_a_publisher_that_never_answers_leaves_the_endpoint_unusable(
    sockdir: Path, zctx: zmq.asyncio.Context
) -> None:
    state = EndpointKvState(stale_s=5.0)
    sub = KvEventSubscriber(name="e0", source=KvEventSource(publisher=f"ipc://{sockdir}/nobody"), state=state,
                            context=zctx)
    sub.start()
    assert not await eventually(lambda: state.connected, timeout_s=0.5)
    assert state.reason() == "disconnected"
    await sub.aclose()


async def test_gateway_replicas_that_each_subscribe_agree(sockdir: Path, zctx: zmq.asyncio.Context) -> None:
    """The shared-state design: every replica follows every engine itself, so replicas agree without a shared
    writer; one started later (a new pod, a restart) catches up from the replay ring."""
    source = KvEventSource(publisher=f"ipc://{sockdir}/p", replay=f"ipc://{sockdir}/r")
    pub = await FakeKvPublisher(publisher=source.publisher, replay=source.replay).start()
    engine = Engine(pub, seed=8)
    try:
        first, a = await follow(zctx, source)
        for i in range(6):
            await engine.store(prompt(i))
        await engine.evict(prompt(3))
        second, b = await follow(zctx, source)  # joins after the events
        await engine.store(prompt(9))
        assert await eventually(lambda: same(a, engine.truth) and same(b, engine.truth))
        assert a.blocks.held == b.blocks.held and len(a.blocks) == 6 * 6 + 6 - 1
        await first.aclose()
        await second.aclose()
    finally:
        await pub.stop()
