"""A KV-event publisher that speaks vLLM's ZMQ protocol, for the fake engine and fault-injection tests.

Same wire protocol as vLLM's `ZmqEventPublisher`: a PUB socket bound at `publisher` sends
`(topic, seq as 8 bytes big-endian, payload)` per batch, seq counting from 0; a ROUTER socket bound at
`replay` answers `(empty, start seq)` with every buffered batch from that seq on, each as
`(identity, empty, topic, seq, payload)`, then `(identity, empty, empty, seq -1, empty)`. The last
`buffer_steps` batches are kept for replay. Payloads are `fleetgate.router.kv_events.encode_batch`
in either wire shape.

Faults on demand: `publish(..., deliver=False)` buffers a batch without sending it (a message the PUB
high-water mark dropped: only a replay can recover it); `publish_raw` sends any bytes (garbage);
`stop()` then `start()` again is an engine restart (sockets closed, seq back to 0, buffer emptied).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fleetgate.core.tasks import cancel_and_wait
from fleetgate.router.kv_events import KvEvent, encode_batch

if TYPE_CHECKING:
    import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class FakeKvPublisher:
    def __init__(self, *, publisher: str, replay: str | None = None, topic: str = "", buffer_steps: int = 10_000,
                 shape: str = "map") -> None:
        self.publisher = publisher
        self.replay = replay
        self.topic = topic.encode()
        self.buffer_steps = buffer_steps
        self.shape = shape
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.replays = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> FakeKvPublisher:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(self.publisher)
        if self.replay is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(self.replay)
            self._task = asyncio.create_task(self._serve_replay(), name="fake-kv-replay")
        self.seq = 0
        self.buffer.clear()
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def publish(self, events: Sequence[KvEvent], *, deliver: bool = True, ts: float = 0.0) -> int:
        return await self.publish_raw(encode_batch(list(events), ts=ts, shape=self.shape), deliver=deliver)

    async def publish_raw(self, payload: bytes, *, deliver: bool = True) -> int:
        """Buffer and (unless `deliver` is False) send one batch; a stopped publisher sends nothing (a dead
        publisher thread in an engine that keeps serving)."""
        seq = self.seq
        if self._pub is None:
            return seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if deliver:
            await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big", signed=True)
            self.replays += 1
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self._router.send_multipart([identity, b"", self.topic, seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([identity, b"", b"", END_SEQ, b""])
