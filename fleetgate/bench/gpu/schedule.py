"""Run configurations on GPU slots under one hard deadline, highest value first, never starting what cannot end.

Three phases:
1. **Queues.** One worker per slot (GPU) takes, in matrix order, the next single-slot configuration
   whose estimated duration ends before `deadline - final reserve`; the final reserve is, for each
   final group (configurations that take every slot, e.g. tensor parallel 2), its cheapest member's
   estimate, so the final stage always keeps room for one alternative.
2. **Final.** With every slot free, final configurations run one at a time, in order; a group is done
   once one member served (a member that fails leaves room for the next), and a member runs only if it
   ends before the deadline.
3. **Leftover.** If time remains, the queues take what is left, without a reserve.
A configuration that was never started is reported `not_run` with its estimate and the time left.

Estimates: `est_start_s x scale + bench + stop`, where the scale of compiled and of eager start-ups
is updated from each start-up measured so far (the latest ratio, clamped to [0.5, 2.5]). The runner gets
the configuration's own deadline: its estimate x `OVERRUN` past its start, capped at the global deadline,
and the global deadline itself (`hard_deadline`), up to which it waits for an engine whose log says it is
initialised.
`Runner` is a protocol, so the scheduling is tested with a fake engine and a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetgate.bench.gpu.matrix import SweepConfig

OVERRUN = 1.6  # a configuration may run this much past its estimate (cold caches, slow compiles)
STOP_S = 8.0
CALIBRATION_S = 25.0  # the calibration probe (`load.calibration`): 9 short TTFT requests, three decode levels


class Runner(Protocol):
    def run(
        self,
        config: SweepConfig,
        *,
        slots: tuple[str, ...],
        deadline: float,
        hard_deadline: float | None = None,
    ) -> dict[str, Any]: ...


def bench_seconds(config: SweepConfig) -> float:
    """Expected time of the checks and load levels after start-up."""
    if config.expect == "invalid":
        return 0.0
    levels = sum(3.0 + 0.12 * c * config.rounds for c in config.levels)
    return 5.0 + levels + (5.0 if config.lora_rank else 0.0) + (CALIBRATION_S if config.calibrate else 0.0)


@dataclass
class Estimator:
    scale: dict[bool, float] = field(default_factory=lambda: {True: 1.0, False: 1.0})  # compiled -> factor
    bench: Callable[[SweepConfig], float] = bench_seconds
    stop_s: float = STOP_S

    def seconds(self, config: SweepConfig) -> float:
        if config.expect == "invalid":
            return 1.0
        return config.est_start_s * self.scale[config.compiled] + self.bench(config) + self.stop_s

    def observe(self, config: SweepConfig, result: dict[str, Any]) -> None:
        ready = (result.get("milestones") or {}).get("ready")
        if isinstance(ready, int | float) and config.est_start_s > 0:
            self.scale[config.compiled] = min(2.5, max(0.5, ready / config.est_start_s))


class Scheduler:
    def __init__(
        self, *, configs: list[SweepConfig], slots: tuple[str, ...], deadline: float, runner: Runner,
        on_result: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = print, estimator: Estimator | None = None,
    ) -> None:  # fmt: skip
        self.configs, self.slots, self.deadline = configs, slots, deadline
        self.runner, self.on_result, self.clock, self.log = runner, on_result, clock, log
        self.estimator = estimator or Estimator()
        self._lock = threading.Lock()
        self._pending = [c for c in configs if not c.final]
        self._finals = [c for c in configs if c.final]
        self._done_groups: set[str] = set()
        self.results: dict[str, dict[str, Any]] = {}

    def _final_reserve(self) -> float:
        by_group: dict[str, float] = {}
        for c in self._finals:
            key = c.group or c.name
            if key in self._done_groups:
                continue
            by_group[key] = min(by_group.get(key, float("inf")), self.estimator.seconds(c))
        return sum(by_group.values())

    def _take(self, *, reserve: bool) -> SweepConfig | None:
        with self._lock:
            now = self.clock()
            limit = self.deadline - (self._final_reserve() if reserve else 0.0)
            for config in self._pending:
                if now + self.estimator.seconds(config) <= limit:
                    self._pending.remove(config)
                    return config
            return None

    def _run(self, config: SweepConfig, slots: tuple[str, ...]) -> dict[str, Any]:
        start = self.clock()
        estimate = self.estimator.seconds(config)
        own = min(self.deadline, start + estimate * OVERRUN)
        self.log(f"{config.name}: start on {','.join(slots)}, estimate {estimate:.0f}s, "
                 f"{self.deadline - start:.0f}s left")  # fmt: skip
        try:
            result = self.runner.run(config, slots=slots, deadline=own, hard_deadline=self.deadline)
        except Exception as exc:  # one configuration's crash must not end the sweep
            result = {"name": config.name, "status": "failed", "failure": f"harness: {type(exc).__name__}: {exc}"}
        result.setdefault("name", config.name)
        result["estimate_s"] = round(estimate, 1)
        result["wall_s"] = round(self.clock() - start, 1)
        with self._lock:
            self.estimator.observe(config, result)
            self.results[config.name] = result
        self.on_result(result)
        self.log(f"{config.name}: {result.get('status')} after {result['wall_s']:.0f}s")
        return result

    def _queue_worker(self, slot: str, *, reserve: bool) -> None:
        while (config := self._take(reserve=reserve)) is not None:
            self._run(config, (slot,))

    def _queues(self, *, reserve: bool) -> None:
        threads = [threading.Thread(target=self._queue_worker, args=(s,), kwargs={"reserve": reserve}, daemon=True)
                   for s in self.slots]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _final_stage(self) -> None:
        for config in list(self._finals):
            key = config.group or config.name
            if key in self._done_groups:
                continue
            if self.clock() + self.estimator.seconds(config) > self.deadline:
                continue
            self._finals.remove(config)
            result = self._run(config, self.slots[: max(1, config.gpus)])
            if result.get("status") == "served":
                self._done_groups.add(key)

    def run(self) -> dict[str, dict[str, Any]]:
        self._queues(reserve=True)
        self._final_stage()
        self._queues(reserve=False)
        left = self.deadline - self.clock()
        for config in self._pending + self._finals:
            if config.name in self.results:
                continue
            if config.final and (config.group or config.name) in self._done_groups:
                reason = f"another member of group {config.group!r} served"
            else:
                reason = f"deadline: needs ~{self.estimator.seconds(config):.0f}s, {max(0.0, left):.0f}s left"
            result = {"name": config.name, "status": "not_run", "reason": reason, "expect": config.expect,
                      "knobs": list(config.knobs)}  # fmt: skip
            self.results[config.name] = result
            self.on_result(result)
        return self.results
