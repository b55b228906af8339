"""Drives a `SimEngine` in real time: one asyncio task runs steps and sleeps their scaled duration.

Engine time advances with the wall clock divided by `profile.time_scale`, so a 0.1 time scale runs
ten times faster than the modelled engine while TTFT and metrics stay in engine seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from fleetgate.sim.engine import PendingLoad, SimEngine, SimRequest


class EngineRunner:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._ids = itertools.count()

    def now(self) -> float:
        """Engine seconds since start."""
        return (asyncio.get_running_loop().time() - self._t0) / self.engine.profile.time_scale

    def start(self) -> None:
        self._t0 = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._loop(), name=f"sim-engine-{self.engine.name}")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(
        self, *, prompt: str, max_tokens: int | None, adapter: str | None = None
    ) -> tuple[SimRequest, asyncio.Queue[SimRequest]]:
        """Queue a request; the returned queue receives the request after each token it gets."""
        req = self.engine.make_request(
            request_id=f"{self.engine.name}-{next(self._ids)}", prompt=prompt, max_tokens=max_tokens, now=self.now(),
            adapter=adapter,
        )
        updates: asyncio.Queue[SimRequest] = asyncio.Queue()
        req.listener = updates.put_nowait
        self.engine.add(req)
        self._wake.set()
        return req, updates

    async def load_adapter(self, *, name: str, path: str) -> None:
        """Load adapter `name` at runtime; returns once the engine step that loads it has ended (raises
        `fleetgate.sim.lora.LoraError` when the engine refuses it)."""
        load = self.engine.request_load(name=name, path=path)
        if load.done:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous = load.listener

        def finished(pending: PendingLoad) -> None:
            if previous is not None:
                previous(pending)
            if not done.done():
                done.set_result(None)

        load.listener = finished
        self._wake.set()
        await done

    async def _loop(self) -> None:
        scale = self.engine.profile.time_scale
        while True:
            step = self.engine.plan_step()
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(step.duration_s * scale)
            self.engine.finish_step(step, now=self.now())
