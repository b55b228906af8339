"""Follows one engine's KV-event stream over ZMQ and keeps its `EndpointBlocks` true, or says it is not.

vLLM's `ZmqEventPublisher` binds a PUB socket (`endpoint`) and, optionally, a ROUTER socket
(`replay_endpoint`) that answers a request for "every batch from sequence number s on" out of a ring of
the last `buffer_steps` batches, then an end marker (seq -1). Each PUB message is `(topic, seq, payload)`,
seq counting from 0 per engine process. This subscriber connects a SUB socket (ZMQ reconnects by itself)
and a socket monitor, and keeps the invariant that the block set never claims a block the engine dropped:

- connected (monitor: `CONNECTED`): clear, then *resync*: replay from seq 0 and apply every batch the
  engine still buffers. A ring that starts after 0 gives a partial set (blocks stored before it are
  unknown), never a wrong one, because it is contiguous up to now.
- disconnected (monitor: `DISCONNECTED`; the engine died or restarted): clear, not usable.
- a live seq <= the last live seq: the engine restarted (seq starts again at 0): clear and resync.
- a live seq > the next expected one: messages were dropped (PUB high-water mark, slow joiner): replay
  from the first missing seq; if the ring no longer has it, clear and rebuild from the ring's start.
- a live seq < the next expected one after a replay: already applied through the replay, skipped.
- no replay endpoint: a gap or restart clears the set and following resumes from the live stream
  (only blocks stored from then on are known).
- a payload that does not decode is counted; it may have held a `BlockRemoved`, so the set is cleared
  and following goes on from the next seq.

Whether the scorer may trust the set is `EndpointKvState.usable(now)`: connected, synced, and not
stale. Stale means: a request that must have made the engine store new blocks (the scorer saw it
miss part of its prefix) finished more than `stale_s` ago and no batch arrived since
(`expect_blocks`): the publisher went silent while the engine works. An idle engine publishes
nothing, which is why silence alone is not staleness.

Why every gateway replica subscribes to every engine itself (no shared writer into Redis): the event
stream is the authority and every subscriber derives the same set from it, so the replicas agree without
a write path, a leader or a Redis round trip per decision; a Redis outage leaves precise routing intact;
the set is rebuilt after a replica restart from the engines' replay rings. The cost is one TCP
connection per (replica, engine) and one copy of each message per replica, which ZMQ's PUB fan-out
absorbs (kilobytes per engine step). The approximate index the scorer falls back to stays shared through
Redis as before (`fleetgate.router.prefix_sync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from fleetgate.core.tasks import cancel_and_wait
from fleetgate.router.kv_block_index import ApplyCounts, EndpointBlocks
from fleetgate.router.kv_events import MAX_PAYLOAD_BYTES, KvEventDecodeError, decode_batch

if TYPE_CHECKING:
    import zmq.asyncio

log = logging.getLogger(__name__)
END_SEQ = -1
REPLAY_YIELD_EVERY = 64  # batches applied between yields to the event loop during a long replay
DRAIN_MAX = 256  # live batches applied in one go before the loop gets a turn
COALESCE_S = 0.05  # after a drain that got batches, wait this long before the next (see `_follow`)


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """Where one engine publishes: ZMQ addresses (`tcp://host:port`, `ipc:///path`) and the topic."""

    publisher: str
    replay: str | None = None
    topic: str = ""


@dataclass(slots=True)
class KvStats:
    batches: int = 0
    decode_errors: int = 0
    gaps: int = 0
    restarts: int = 0
    resyncs: int = 0
    replay_failures: int = 0
    disconnects: int = 0
    wakes: int = 0  # drains that applied live batches (batches / wakes: how many each wake coalesced)
    applied: ApplyCounts = field(default_factory=ApplyCounts)


class EndpointKvState:
    """The block set of one engine plus what decides whether it may be trusted now."""

    def __init__(self, *, blocks: EndpointBlocks | None = None, stale_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.blocks = blocks or EndpointBlocks()
        self.stale_s = stale_s
        self.clock = clock
        self.connected = False
        self.synced = False
        self.next_seq: int | None = None  # the next seq to apply; None: accept whatever comes (live only)
        self.live_seq: int | None = None  # the last seq seen on the PUB stream (monotonic per engine process)
        self.batches = 0
        self.last_batch_at: float | None = None
        self.expect_since: float | None = None
        self.stats = KvStats()

    def usable(self, now: float | None = None) -> bool:
        if not (self.connected and self.synced):
            return False
        if self.expect_since is None:
            return True
        return (self.clock() if now is None else now) - self.expect_since <= self.stale_s

    def reason(self, now: float | None = None) -> str:
        """Why the set is not usable ("ok" when it is): disconnected, syncing or stale."""
        if not self.connected:
            return "disconnected"
        if not self.synced:
            return "syncing"
        return "ok" if self.usable(now) else "stale"

    def expect_blocks(self, *, batches_at_start: int) -> None:
        """A request that stored new blocks there finished: an event is due, unless one came since it started."""
        if self.batches == batches_at_start and self.expect_since is None:
            self.expect_since = self.clock()

    def reset(self, *, connected: bool) -> None:
        self.blocks.clear()
        self.connected = connected
        self.synced = False
        self.next_seq = None
        self.live_seq = None
        self.expect_since = None

    def apply(self, payload: bytes, seq: int) -> bool:
        """Decode and apply one batch. One that does not decode may have held a removal: the set is cleared
        (what follows is applied as usual: a subset, never a wrong set) and False returned."""
        self.next_seq = seq + 1
        try:
            batch = decode_batch(payload)
        except KvEventDecodeError as exc:
            self.stats.decode_errors += 1
            self.blocks.clear()
            log.warning("undecodable KV event batch; block set cleared", extra={"seq": seq, "error": str(exc)})
            return False
        self.blocks.apply(batch, self.stats.applied)
        self.stats.applied.skipped += batch.skipped
        self.batches += 1
        self.stats.batches += 1
        self.last_batch_at = self.clock()
        self.expect_since = None
        return True


class KvEventSubscriber:
    """One asyncio task that follows `source` into `state` until `aclose()`."""

    def __init__(self, *, name: str, source: KvEventSource, state: EndpointKvState,
                 context: zmq.asyncio.Context, replay_timeout_s: float = 2.0,
                 max_message_bytes: int = MAX_PAYLOAD_BYTES, coalesce_s: float = COALESCE_S) -> None:
        if coalesce_s < 0:
            raise ValueError("coalesce_s must be 0 or positive")
        self.name = name
        self.source = source
        self.state = state
        self.context = context
        self.replay_timeout_s = replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.coalesce_s = coalesce_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kv-events-{self.name}")

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.state.reset(connected=False)

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one engine's stream take the gateway down: start over
                log.warning("KV event subscriber failed; reconnecting", exc_info=True, extra={"endpoint": self.name})
                self.state.reset(connected=False)
                await asyncio.sleep(1.0)

    async def _follow(self) -> None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        # Sockets of the (asyncio) context, so that its destroy() closes them, but read only through plain shadows
        # (`zmq.Socket.shadow`: the same socket, blocking API, no event-loop hooks). pyzmq's asyncio Poller costs
        # several loop turns per message and, once used, keeps the socket's descriptor watched for good (a wake per
        # message even while nothing waits). Here the descriptor is watched only while the socket is empty
        # (`_readable`), and after a drain that got batches the task sleeps `coalesce_s`: an engine that publishes
        # every scheduler step costs one wake per interval, not one per step (issue 24: a wake costs far more CPU
        # than decoding a batch).
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        plain_sub: zmq.Socket[bytes] = zmq.Socket.shadow(sub.underlying)
        plain_monitor: zmq.Socket[bytes] = zmq.Socket.shadow(monitor.underlying)
        try:
            sub.connect(self.source.publisher)
            while True:
                if not (_has_message(plain_monitor) or _has_message(plain_sub)):
                    await _readable((plain_sub, plain_monitor), timeout_s=1.0)
                while _has_message(plain_monitor):
                    event = parse_monitor_message(plain_monitor.recv_multipart(zmq.NOBLOCK))
                    if event["event"] == zmq.EVENT_CONNECTED:
                        self.state.reset(connected=True)
                        await self._resync(from_seq=0)
                    elif event["event"] == zmq.EVENT_DISCONNECTED:
                        self.state.stats.disconnects += 1
                        self.state.reset(connected=False)
                got = 0
                while got < DRAIN_MAX and _has_message(plain_sub):  # drain, but give the loop back now and then
                    await self._on_live(plain_sub.recv_multipart(zmq.NOBLOCK))
                    got += 1
                if got:
                    self.state.stats.wakes += 1
                    # the next steps' batches queue in ZMQ meanwhile; a full drain means a backlog: only yield
                    await asyncio.sleep(self.coalesce_s if got < DRAIN_MAX else 0)
        finally:
            with contextlib.suppress(Exception):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_live(self, frames: list[bytes]) -> None:
        state = self.state
        if len(frames) != 3 or len(frames[1]) != 8:
            state.stats.decode_errors += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if not state.connected:
            return  # a message racing the monitor's CONNECTED: the replay after it covers this seq
        if state.live_seq is not None and seq <= state.live_seq:
            state.stats.restarts += 1
            log.info("KV event sequence went back: engine restarted", extra={"endpoint": self.name, "seq": seq})
            state.reset(connected=True)
            await self._resync(from_seq=0)
        state.live_seq = seq
        expected = state.next_seq
        if expected is not None and seq < expected:
            return  # applied already, through a replay
        if expected is not None and seq > expected:
            state.stats.gaps += 1
            await self._resync(from_seq=expected)
            if state.next_seq is not None and seq < state.next_seq:
                return
            if state.next_seq is not None and seq > state.next_seq:
                state.blocks.clear()  # the ring did not reach this far either: what was lost is unknown
        state.apply(frames[2], seq)

    async def _resync(self, *, from_seq: int) -> None:
        """Fill from `from_seq` on out of the engine's replay ring; rebuild from the ring's start when it
        no longer reaches back that far; without a ring, clear and follow live from here."""
        state = self.state
        state.synced = False
        state.stats.resyncs += 1
        batches = await self._replay(from_seq) if self.source.replay else None
        if batches is None:
            if from_seq > 0 or self.source.replay:
                state.stats.replay_failures += int(self.source.replay is not None)
                state.blocks.clear()
            state.next_seq = None
            state.synced = True
            return
        if batches and batches[0][0] != from_seq:
            state.blocks.clear()  # the ring starts later: rebuild from what it has (a subset, never wrong)
        elif not batches:
            state.next_seq = from_seq
        for i, (seq, payload) in enumerate(batches):
            state.apply(payload, seq)
            if i % REPLAY_YIELD_EVERY == REPLAY_YIELD_EVERY - 1:
                await asyncio.sleep(0)
        state.synced = True

    async def _replay(self, from_seq: int) -> list[tuple[int, bytes]] | None:
        """Every buffered batch from `from_seq` on, or None when the replay socket does not answer in time."""
        import zmq

        assert self.source.replay is not None
        dealer = self.context.socket(zmq.DEALER)  # a fresh socket per replay: no late answers from the last one
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        out: list[tuple[int, bytes]] = []
        try:
            dealer.connect(self.source.replay)
            await dealer.send_multipart([b"", from_seq.to_bytes(8, "big", signed=True)])
            deadline = time.monotonic() + self.replay_timeout_s * 10
            while time.monotonic() < deadline:
                if not await dealer.poll(timeout=int(self.replay_timeout_s * 1000)):
                    return None
                frames: list[Any] = await dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    return out
                if seq >= from_seq and (not out or seq == out[-1][0] + 1):
                    out.append((seq, frames[3]))
            return None
        finally:
            dealer.close(linger=0)


def _has_message(sock: zmq.Socket[bytes]) -> bool:
    import zmq

    return bool(cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN)


async def _readable(socks: tuple[zmq.Socket[bytes], ...], *, timeout_s: float) -> None:
    """Return once one of `socks` holds a message, or after `timeout_s`. ZMQ's descriptor signals that the socket's
    state may have changed, not that a message is there: the state (`EVENTS`) is read after the watch is set up and
    on each signal, and the watch is removed before returning."""
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    fds = [sock.FD for sock in socks]
    for fd in fds:
        loop.add_reader(fd, signalled.set)
    try:
        deadline = loop.time() + timeout_s
        while not any(_has_message(sock) for sock in socks):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            signalled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signalled.wait(), remaining)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
