"""When the limits store fails: a half-open circuit breaker and a bounded queue of counter moves to replay.

Circuit (per gateway replica):
- closed: every call goes to the store.
- open (after a failure): calls are not sent to the store for `retry_s`; they short-circuit
  (`admit()` is False) and a short-circuit never moves the end of the open window (the defect this
  replaces: every refused call pushed the window forward, so a replica with steady traffic never
  asked the store again).
- half-open (`retry_s` after the last failure): exactly one caller is admitted as the probe; the
  others keep short-circuiting until it answers. Success closes the circuit; failure opens it again
  for `retry_s`. A failure of a call that started before the last success is stale (it was sent
  while the store was still hanging) and does not reopen the circuit.
So with traffic flowing, the store is tried at least every `retry_s` (+ one store timeout), and the
limits are back that long after the store is.

Queue: counter moves (`Move`) that could not be written (store down, or the call
short-circuited) wait here, bounded (`max_pending` moves, oldest dropped first and counted), and are
written in one batch by the first call that reaches the store again, merged per key. This is what
keeps budgets right through an outage: with `on_store_error: open` a request let through unmetered
queues its whole real usage at settle, so the budget counter ends equal to the ledger.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Move:
    """A settle's correction of one counter. The reservation it corrects was added to the counter of
    generation `epoch` (the tenant's epoch key, see `limiter_redis`; "" when the store was down and nothing
    was reserved). If the counter is still of that generation, `delta` (real - estimate) is added. If it is
    not (Redis lost everything and another request recreated the counter since) the estimate is not in it:
    `absolute` (the real usage alone) is added instead; a counter that does not exist (it expired, or no
    request recreated it yet) is set to `absolute` with `ttl_ms`. Never a negative value from a lost estimate."""

    key: str
    delta: int
    ttl_ms: int
    absolute: int = 0
    epoch_key: str = ""
    epoch: str = ""


class StoreCircuit:
    def __init__(self, *, retry_s: float, max_pending: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._retry_s = retry_s
        self._clock = clock
        self._down = False
        self._down_until = 0.0
        self._probing = False
        self._last_ok = 0.0
        self._pending: deque[Move] = deque(maxlen=max_pending)
        self.dropped = 0  # moves lost to the bound (each one counted, never silent)

    @property
    def down(self) -> bool:
        return self._down

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admit(self) -> float | None:
        """The start time to hand back to `succeeded`/`failed`/`abandoned`, or None: do not call the store."""
        now = self._clock()
        if not self._down:
            return now
        if self._probing or now < self._down_until:
            return None
        self._probing = True
        return now

    def succeeded(self, started: float) -> None:
        self._down = False
        self._probing = False
        self._last_ok = max(self._last_ok, started)

    def failed(self, started: float) -> None:
        if started < self._last_ok:
            return  # sent before the store came back: says nothing about it now
        self._down = True
        self._probing = False
        self._down_until = self._clock() + self._retry_s

    def abandoned(self) -> None:
        """The probe was cancelled before the store answered: let the next caller probe."""
        self._probing = False

    def queue(self, moves: list[Move]) -> None:
        room = (self._pending.maxlen or 0) - len(self._pending)
        self.dropped += max(0, len(moves) - room)
        self._pending.extend(moves)

    def take(self) -> list[Move]:
        """Every queued move, merged per (key, epoch): moves of one counter generation add up, moves of
        different generations are applied each by its own rule (the queue is emptied before any await: one
        replayer)."""
        if not self._pending:
            return []
        merged: dict[tuple[str, str], Move] = {}
        while self._pending:
            m = self._pending.popleft()
            old = merged.get((m.key, m.epoch))
            merged[m.key, m.epoch] = m if old is None else Move(
                m.key, old.delta + m.delta, max(old.ttl_ms, m.ttl_ms), old.absolute + m.absolute, m.epoch_key,
                m.epoch)
        return [m for m in merged.values() if m.delta or m.absolute]

    def requeue(self, moves: list[Move]) -> None:
        """Put moves back at the front after a failed replay (they are older than anything queued since)."""
        self._pending.extendleft(reversed(moves))
