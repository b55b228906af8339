"""Kopf's operator embedded in a process that has its own event loop (tests, `fleetgate bench operator`).

Kopf owns the event loop it runs in: when it stops, it takes every task created in that loop after its
start-up for one of its own workers, waits up to 5 s (fixed in `kopf._core.reactor.running.run_tasks`)
for them to end, then cancels them. In a shared loop those tasks are the caller's: the test's teardown
that is awaiting the operator (so every stop took the full 5 s and then cancelled the teardown itself),
and the in-process API server's per-connection tasks. Kopf's embedding guide says the same: give the
operator an event loop of its own in a thread of its own. `EmbeddedOperator` does that: the operator
runs in a daemon thread with a fresh loop, started and stopped from the caller's loop through
thread-safe flags, and an operator that crashed or does not stop in time is an error on stop.

Handlers run in the operator's thread: whatever they share with the caller (fakes, settings) is read and
written from both threads, so keep it to plain containers or immutable values.

On stop, Kopf first lets each object's worker process the events still queued, for up to
`settings.queueing.exit_timeout` (Kopf's default: 2 s). With the watches already closed, Kopf cannot see its own
last-handled annotation come back, so the events queued before it look unhandled and the create handler runs
again, in full, on stale copies (logged: the reconcile in flight plus one or two more after every stop). For a
caller that is done with the operator that is time spent on nothing: an embedded operator gives its workers
`QUEUE_EXIT_S` unless the caller passes Kopf settings of its own. A reconcile cut short is redone by the next
operator's resume handlers, as after any operator restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

_POLL_S = 0.02  # how often the caller's loop looks at the thread: short next to a reconcile
QUEUE_EXIT_S = 0.2  # Kopf's queueing.exit_timeout here (see the module docstring)
SLOW_STOP_S = 1.0  # a stop still running after this long logs the operator loop's tasks (what it waits for)

log = logging.getLogger(__name__)


class OperatorError(RuntimeError):
    """The embedded operator crashed, or did not start or stop within its time."""


class EmbeddedOperator:
    """`kopf.operator(**operator_args)` in a thread and event loop of its own."""

    def __init__(self, *, name: str = "kopf-operator", **operator_args: Any) -> None:
        for flag in ("stop_flag", "ready_flag"):
            if flag in operator_args:
                raise TypeError(f"{flag} is set by EmbeddedOperator")
        self._args = operator_args
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._finished = threading.Event()  # kopf.operator() returned or raised (the thread may still be ending)
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lingering: list[str] = []  # the operator loop's tasks once a stop took SLOW_STOP_S (diagnostics)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        import kopf  # lazy: Kopf is heavy and only this thread needs it

        args = dict(self._args)
        if args.get("settings") is None:
            args["settings"] = kopf.OperatorSettings()
            args["settings"].queueing.exit_timeout = QUEUE_EXIT_S

        async def operate() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                await kopf.operator(stop_flag=self._stop, ready_flag=self._ready, **args)
            finally:
                self._finished.set()

        try:
            asyncio.run(operate())
        except BaseException as exc:  # reported to the caller by stop(); a thread has nobody else to tell
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def _snapshot(self) -> None:
        """In the operator's loop: note (and log) what a slow stop is waiting for."""
        self.lingering = sorted(repr(task) for task in asyncio.all_tasks())
        log.warning("the embedded operator is still stopping after %g s; its tasks: %s", SLOW_STOP_S, self.lingering)

    def done(self) -> bool:
        """Whether the operator has exited (crashed, or stopped by `stop`)."""
        return self._finished.is_set()

    async def wait_ready(self, *, within: float) -> None:
        """Wait until Kopf's start-up handlers ran and it watches; raises if it exits or takes too long."""
        deadline = time.monotonic() + within
        while not self._ready.is_set():
            if self._finished.is_set():
                raise OperatorError("the operator exited during start-up") from self._error
            if time.monotonic() > deadline:
                raise OperatorError(f"the operator was not ready within {within} s")
            await asyncio.sleep(_POLL_S)

    async def stop(self, *, within: float) -> None:
        """Raise the stop flag and wait for the thread; raises if it crashed or did not end in time."""
        self._stop.set()
        started = time.monotonic()
        snapshot_asked = False
        while self._thread.is_alive():
            if time.monotonic() > started + within:
                raise OperatorError(f"the operator did not stop within {within} s of its stop flag; its tasks then: "
                                    f"{self.lingering}")
            if not snapshot_asked and time.monotonic() > started + SLOW_STOP_S and self._loop is not None:
                snapshot_asked = True
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing lingers
                    self._loop.call_soon_threadsafe(self._snapshot)
            await asyncio.sleep(_POLL_S)
        if self._error is not None:
            raise OperatorError(f"the operator crashed: {self._error!r}") from self._error


@contextlib.asynccontextmanager
async def running_operator(
    *, ready_within: float = 30.0, stop_within: float = 15.0, **operator_args: Any
) -> AsyncIterator[EmbeddedOperator]:
    """A started, ready `EmbeddedOperator`, stopped on exit (an error if it crashed or hangs on stop)."""
    embedded = EmbeddedOperator(**operator_args)
    embedded.start()
    try:
        await embedded.wait_ready(within=ready_within)
        yield embedded
    finally:
        await embedded.stop(within=stop_within)
