"""The GPU sweep's scheduling: value order, a hard deadline never overrun, the final stage's reserve, group
alternatives, crashes contained. A fake runner sleeps for each configuration's "start-up" (tenths of a
second standing in for minutes), so these run in about a second each on real threads and a real clock."""

from __future__ import annotations

import threading
import time
from typing import Any

from fleetgate.bench.gpu.matrix import SweepConfig
from fleetgate.bench.gpu.schedule import OVERRUN, Estimator, Scheduler


def _config(name: str, est: float, *, final: bool = False, group: str | None = None, eager: bool = True) -> SweepConfig:
    engine = {"enforceEager": eager}
    return SweepConfig(name=name, shape="tiny-llama", spec={"engine": engine}, knobs=(), est_start_s=est,
                       final=final, group=group, gpus=2 if final else 1)  # fmt: skip


class FakeRunner:
    """Takes `took[name]` seconds (default: the estimate), never past its deadline; `status[name]` to fail."""

    def __init__(self, took: dict[str, float] | None = None, status: dict[str, str] | None = None) -> None:
        self.took, self.status = took or {}, status or {}
        self.calls: list[tuple[str, tuple[str, ...], float, float]] = []
        self.lock = threading.Lock()

    def run(
        self, config: SweepConfig, *, slots: tuple[str, ...], deadline: float, hard_deadline: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        start = time.monotonic()
        with self.lock:
            self.calls.append((config.name, slots, start, deadline))
        if self.status.get(config.name) == "crash":
            raise RuntimeError("the harness broke")
        took = self.took.get(config.name, config.est_start_s)
        time.sleep(max(0.0, min(took, deadline - start)))
        return {"name": config.name, "status": self.status.get(config.name, "served"), "milestones": {"ready": took}}


def _run(configs: list[SweepConfig], *, budget: float, runner: FakeRunner, slots: tuple[str, ...] = ("0",)
         ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], float]:  # fmt: skip
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget
    scheduler = Scheduler(configs=configs, slots=slots, deadline=deadline, runner=runner, on_result=seen.append,
                          log=lambda _m: None, estimator=Estimator(bench=lambda _c: 0.0, stop_s=0.0))  # fmt: skip
    return scheduler.run(), seen, deadline


def test_value_order_and_nothing_started_that_cannot_end() -> None:
    runner = FakeRunner()
    configs = [_config("a", 0.3), _config("b", 0.3), _config("c", 0.3)]
    results, seen, deadline = _run(configs, budget=0.75, runner=runner)
    assert [c[0] for c in runner.calls] == ["a", "b"]
    assert results["c"]["status"] == "not_run" and "deadline" in results["c"]["reason"]
    assert sorted(r["name"] for r in seen) == ["a", "b", "c"]  # every configuration reported once
    assert all(call[3] <= deadline for call in runner.calls)
    assert time.monotonic() <= deadline + 0.05


def test_final_stage_keeps_its_reserve() -> None:
    runner = FakeRunner()
    configs = [_config("a", 0.3), _config("b", 0.3), _config("tp", 0.3, final=True)]
    results, _, _ = _run(configs, budget=0.75, runner=runner, slots=("0", "1"))
    order = [c[0] for c in runner.calls]
    assert "tp" in order and order[-1] == "tp" and results["tp"]["status"] == "served"
    assert next(c for c in runner.calls if c[0] == "tp")[1] == ("0", "1")  # both slots


def test_queues_run_in_parallel() -> None:
    runner = FakeRunner()
    _run([_config("a", 0.3), _config("b", 0.3)], budget=1.0, runner=runner, slots=("0", "1"))
    starts = {c[0]: (c[1], c[2]) for c in runner.calls}
    assert {starts["a"][0], starts["b"][0]} == {("0",), ("1",)}
    assert abs(starts["a"][1] - starts["b"][1]) < 0.1


def test_group_takes_the_first_member_that_fits_and_stops_once_one_served() -> None:
    runner = FakeRunner()
    configs = [_config("a", 0.3), _config("tp-compiled", 0.6, final=True, group="tp", eager=False),
               _config("tp-eager", 0.2, final=True, group="tp")]  # fmt: skip
    results, _, _ = _run(configs, budget=0.7, runner=runner)
    assert [c[0] for c in runner.calls] == ["a", "tp-eager"]
    assert results["tp-compiled"]["status"] == "not_run"
    roomy = FakeRunner()
    results, _, _ = _run(configs, budget=1.5, runner=roomy)
    assert [c[0] for c in roomy.calls] == ["a", "tp-compiled"]
    assert "another member" in results["tp-eager"]["reason"]


def test_a_failed_member_leaves_room_for_the_next() -> None:
    runner = FakeRunner(status={"tp-compiled": "failed"}, took={"tp-compiled": 0.1})
    configs = [_config("tp-compiled", 0.3, final=True, group="tp", eager=False),
               _config("tp-eager", 0.2, final=True, group="tp")]  # fmt: skip
    results, _, _ = _run(configs, budget=1.0, runner=runner)
    assert results["tp-compiled"]["status"] == "failed" and results["tp-eager"]["status"] == "served"


def test_a_configuration_gets_its_estimate_times_the_overrun_and_a_crash_stays_its_own() -> None:
    runner = FakeRunner(status={"a": "crash"})
    results, _, deadline = _run([_config("a", 0.2), _config("b", 0.2)], budget=5.0, runner=runner)
    assert results["a"]["status"] == "failed" and "the harness broke" in results["a"]["failure"]
    assert results["b"]["status"] == "served"
    name, _, start, own = runner.calls[1]
    assert name == "b" and own <= min(deadline, start + 0.2 * OVERRUN + 0.05)


def test_estimates_learn_from_measured_start_ups() -> None:
    estimator = Estimator(bench=lambda _c: 0.0, stop_s=0.0)
    slow = _config("slow", 10.0)
    estimator.observe(slow, {"milestones": {"ready": 20.0}})
    assert estimator.seconds(_config("next", 10.0)) == 20.0
    assert estimator.seconds(_config("compiled", 10.0, eager=False)) == 10.0  # compiled start-ups learn apart
    estimator.observe(slow, {"milestones": {"ready": 100.0}})
    assert estimator.seconds(_config("next", 10.0)) == 25.0  # clamped
