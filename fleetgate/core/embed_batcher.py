"""`BatchingEmbedder`: micro-batches concurrent embedding requests into one encode call.

Algorithm. `aembed(text)` queues (text, future) and makes sure one drain task runs. The drain task takes
up to `max_batch` queued texts, waiting at most `max_wait_s` for more to arrive while the batch is not
full, encodes them in one call on a single worker thread (off the event loop) and hands each caller its
row. Texts that arrive while an encode runs queue up and form the next batch, so under load batches grow
by themselves without extra waiting, and at concurrency 1 a request waits at most `max_wait_s`.

Errors: an encode that raises fails every caller of that batch with the same exception; the next batch
is tried afresh. A caller that is cancelled (client gone, timeout) drops out of its batch: the others still
get their rows. One worker thread: the model's own intra-op threads are the parallelism, and a 1-core
gateway gains nothing from two encodes competing.

Coalescing: a caller asking for a (scope, text) already queued or being encoded waits for that encode
instead of queueing the text again (`coalesced` counts them). Concurrent lookups often need one text at
once: many near-duplicate prompts whose nearest entry was stored before its vector existed each asked for
it: in-process, 64 concurrent varied misses after 2,000 stored number-vetoed ones asked for one text up to
37 times, each a separate encode before this, and cost the prefilter 0.5x the throughput of encoding every
lookup in `bench gateway`'s varied misses. The encode
is shielded from any one caller leaving, and dropped only when every caller has left (in-process, with 64
concurrent lookups of varied misses: 1,445 of 2,940 requests for a text joined an encode already under way).

Memo: with `memo_entries` > 0 the vectors of the last texts embedded are kept ((scope, exact text) ->
vector, least recently used out first), so a text seen again (retries, templated prompts, a paraphrase
asked over and over) returns at once, without queueing or encoding. The caller's `scope` (the cache passes
its partition: tenant, model, parameters) is part of the key, so how fast a text comes back never tells
one tenant that another sent it. Callers get a copy: a caller that changes its
vector in place cannot change what the next caller of that text gets. Only texts this process embedded
are memoised; a failed encode stores nothing.

Remote encoders: an embedder with `async aencode(texts)` (an encoder service,
`fleetgate.cache.remote_encoder`) is awaited on the event loop instead of a worker thread, with up to
`max_in_flight` batches out at once (a thread-run encoder always has one: its one worker). The drain task
waits for a free slot before it takes a batch, so texts that arrive while every slot is busy still form the
next batch. `timeout_s` bounds how long any caller waits for its vector, queueing included: past it the
caller gets `TimeoutError` and leaves (the encode goes on for the others, or is dropped when nobody waits).

The wrapped embedder stays reachable through the blocking `embed(texts)` (same contract as any embedder,
for offline callers and the tier router's own thread). `load()` loads the model only when `preload` is set:
otherwise the model loads on the first embedding, in the worker thread, so a gateway whose traffic never
reaches the semantic layer never imports the runtime.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class BlockingEmbedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


Batch = list[tuple[str, str, "asyncio.Future[np.ndarray]"]]  # (scope, text, the future its callers wait on)


class BatchingEmbedder:
    def __init__(
        self,
        *,
        embedder: BlockingEmbedder,
        max_batch: int = 32,
        max_wait_s: float = 0.0,
        preload: bool = False,
        memo_entries: int = 0,
        max_in_flight: int = 1,
        timeout_s: float | None = None,
    ) -> None:
        if max_batch < 1 or max_wait_s < 0 or memo_entries < 0 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be >= 1, max_wait_s >= 0 and memo_entries >= 0")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be > 0 (None: no bound)")
        self.inner = embedder
        self.dim = embedder.dim
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        # an encoder service is awaited, several requests at once; a model in this process runs in one worker
        self._aencode = getattr(embedder, "aencode", None)
        self.max_in_flight = max_in_flight if self._aencode is not None else 1
        self._slots: asyncio.Semaphore | None = None
        self._encodes: set[asyncio.Task[None]] = set()
        self._preload = preload
        self._queue: deque[tuple[str, str, asyncio.Future[np.ndarray]]] = deque()
        self._full: asyncio.Event | None = None
        self._drain: asyncio.Task[None] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._memo: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.memo_entries = memo_entries
        # (scope, text) queued or being encoded -> its future and how many callers wait for it
        self._inflight: dict[tuple[str, str], tuple[asyncio.Future[np.ndarray], list[int]]] = {}
        self.batches = 0  # encode calls made (tests, diagnostics)
        self.memo_hits = 0
        self.coalesced = 0  # callers that joined an encode of the same text already queued or running

    def load(self) -> None:
        """Start-up hook (blocking): load the model now only when configured to preload."""
        load = getattr(self.inner, "load", None)
        if self._preload and load is not None:
            load()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking, unbatched: the wrapped embedder's own call."""
        return self.inner.embed(texts)

    async def aembed(self, text: str, *, scope: str = "") -> np.ndarray:
        """The embedding of one text (384 floats for MiniLM), encoded together with concurrent callers'.
        `scope` only separates memo entries (see the module docstring); the vector never depends on it."""
        known = self._memo.get((scope, text)) if self.memo_entries else None
        if known is not None:
            self._memo.move_to_end((scope, text))
            self.memo_hits += 1
            return known.copy()
        key = (scope, text)
        inflight = self._inflight.get(key)
        if inflight is not None and not inflight[0].done():
            self.coalesced += 1
            future, waiting = inflight
        else:
            loop = asyncio.get_running_loop()
            future, waiting = loop.create_future(), [0]
            self._inflight[key] = (future, waiting)
            self._queue.append((scope, text, future))
            if self._full is None:
                self._full = asyncio.Event()
            if len(self._queue) >= self.max_batch:
                self._full.set()
            if self._drain is None or self._drain.done():
                self._drain = loop.create_task(self._run(), name="embed-batcher")
        waiting[0] += 1
        try:
            # shielded: one caller that leaves must not cancel the encode the others wait for
            if self.timeout_s is None:
                return (await asyncio.shield(future)).copy()
            return (await asyncio.wait_for(asyncio.shield(future), self.timeout_s)).copy()
        finally:
            waiting[0] -= 1
            if waiting[0] == 0 and not future.done():
                future.cancel()  # nobody waits any more: `_take` drops it, no encode is spent on it
            if future.done() and self._inflight.get(key, (None,))[0] is future:
                del self._inflight[key]

    def _take(self) -> Batch:
        batch: Batch = []
        while self._queue and len(batch) < self.max_batch:
            item = self._queue.popleft()
            if not item[2].done():  # a cancelled caller does not cost an encode
                batch.append(item)
        return batch

    async def _run(self) -> None:
        assert self._full is not None
        if self._slots is None or not self._encodes:  # none out: a fresh one (this loop's), all slots free
            self._slots = asyncio.Semaphore(self.max_in_flight)
        while self._queue:
            await self._slots.acquire()  # before taking: texts arriving meanwhile join this batch
            if len(self._queue) < self.max_batch and self.max_wait_s > 0:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), timeout=self.max_wait_s)
            batch = self._take()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._encode(batch), name="embed-batch")
            self._encodes.add(task)
            task.add_done_callback(self._encoded)

    def _encoded(self, task: asyncio.Task[None]) -> None:
        self._encodes.discard(task)
        assert self._slots is not None
        self._slots.release()

    async def _encode(self, batch: Batch) -> None:
        texts = [text for _, text, _ in batch]
        try:
            if self._aencode is not None:
                vectors = await self._aencode(texts)
            else:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
                vectors = await asyncio.get_running_loop().run_in_executor(self._pool, self.inner.embed, texts)
        except Exception as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved here: a future all of whose callers left is not logged
            return
        self.batches += 1
        for row, (scope, text, future) in enumerate(batch):
            if self.memo_entries:
                self._remember((scope, text), vectors[row])
            if not future.done():
                future.set_result(vectors[row])  # every caller gets its own copy (`aembed`)

    def _remember(self, key: tuple[str, str], vector: np.ndarray) -> None:
        self._memo[key] = np.array(vector, dtype=np.float32)  # its own copy, not a view of the batch
        self._memo.move_to_end(key)
        while len(self._memo) > self.memo_entries:
            self._memo.popitem(last=False)

    async def aclose(self) -> None:
        """Finish queued work, stop the worker thread and close the encoder service's connections."""
        if self._drain is not None and not self._drain.done():
            await asyncio.wait([self._drain])
        if self._encodes:
            await asyncio.wait(list(self._encodes))
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
