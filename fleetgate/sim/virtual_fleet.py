"""A discrete-event run of a workload on N simulated engines, routed by a real `Scheduler`.

Engine time is virtual: the event loop jumps from event to event (arrivals, step ends, metric
scrapes), so a fleet-minute runs in a second on two cores and results do not depend on machine
noise. The scheduler is the real one (`pick` awaited, `on_start`/`on_complete` called as the
gateway calls them); only its `/metrics` scraper is replaced by a copy of each engine's state every
`scrape_interval_s` of engine time (the same staleness a real scraper has). Decision latency is
measured on this machine twice: wall clock (includes preemption by other processes on a shared
machine) and this thread's CPU time (the decision's own cost).

LoRA: a work item may name an adapter (the profile must enable LoRA). Its routing request carries it;
when the picked engine has not loaded it, the run does what the gateway does: it asks that engine to
load it (`SimEngine.request_load`, the engine pays `lora_load_s` in its loop), tells the scheduler's
`FleetState` once loaded, and queues the request then (its TTFT includes the wait). Each scrape also
copies every engine's loaded adapters into the `FleetState`, as the scraper reads `/v1/models`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.types import RoutingRequest, Scheduler
from fleetgate.sim.engine import SimEngine, SimRequest, Step
from fleetgate.sim.profile import SimProfile
from fleetgate.sim.workloads import WorkItem


class VirtualClock:
    """Engine time of the run; pass it to `build_scheduler(clock=...)` so health and staleness agree."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(slots=True)
class RunResult:
    ttft_s: list[float] = field(default_factory=list)
    decision_s: list[float] = field(default_factory=list)  # wall clock, includes preemption by other processes
    decision_cpu_s: list[float] = field(default_factory=list)  # this thread's CPU time only
    per_endpoint: dict[str, int] = field(default_factory=dict)
    prefix_queries: int = 0
    prefix_hits: int = 0
    output_tokens: int = 0
    makespan_s: float = 0.0
    busy_s: float = 0.0  # engine-seconds spent in steps, summed over engines
    adapter_loads: int = 0  # on-demand runtime loads asked of engines
    disk_loads: int = 0  # adapter loads from disk inside engines (runtime loads + CPU-cache reloads)
    slot_swaps: int = 0  # adapters copied into a GPU slot

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def throughput_tps(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0


async def run_virtual_fleet(
    *, scheduler: Scheduler, items: Sequence[WorkItem], replicas: int, profile: SimProfile,
    scrape_interval_s: float = 0.5, model: str = "sim-model", clock: VirtualClock | None = None,
) -> RunResult:
    engines = [SimEngine(profile=profile, name=f"sim-{i}") for i in range(replicas)]
    endpoints = [Endpoint(id=f"sim-{i}", url=f"sim://{i}", model=model) for i in range(replicas)]
    state = getattr(scheduler, "state", None)  # a PluginScheduler's FleetState, fed like a scraper would
    seq = itertools.count()
    events: list[tuple[float, int, str, Any]] = []
    by_id = {it.id: it for it in items}
    followers: dict[str, list[WorkItem]] = {}
    for it in items:
        if it.after is None:
            heapq.heappush(events, (it.arrival_s, next(seq), "arrive", it))
        else:
            followers.setdefault(it.after, []).append(it)
    busy = [False] * replicas
    waiting_load: dict[tuple[int, str], list[SimRequest]] = {}  # (engine, adapter) -> requests queued behind a load
    inflight: dict[int, tuple[RoutingRequest, int, WorkItem]] = {}
    result = RunResult()
    if state is not None:
        heapq.heappush(events, (0.0, next(seq), "scrape", None))
    remaining = len(items)

    def schedule_step(i: int, now: float) -> None:
        step = engines[i].plan_step()
        busy[i] = step is not None
        if step is not None:
            heapq.heappush(events, (now + step.duration_s, next(seq), "step", (i, step)))

    now = 0.0
    while events and remaining:
        now, _, kind, payload = heapq.heappop(events)
        if clock is not None:
            clock.t = now
        if kind == "arrive":
            item: WorkItem = payload
            req = RoutingRequest(request_id=item.id, model=model, prompt_text=item.prompt,
                                 session_key=item.session_key, max_tokens=item.max_tokens, adapter=item.adapter)
            t0, c0 = time.perf_counter(), time.thread_time()
            decision = await scheduler.pick(req, endpoints)
            result.decision_s.append(time.perf_counter() - t0)
            result.decision_cpu_s.append(time.thread_time() - c0)
            i = endpoints.index(decision.endpoint)
            scheduler.on_start(req, decision.endpoint)
            result.per_endpoint[decision.endpoint.id] = result.per_endpoint.get(decision.endpoint.id, 0) + 1
            eng = engines[i]
            if item.adapter is not None and item.adapter not in eng.adapters():
                eng.request_load(name=item.adapter, path=f"/adapters/{item.adapter}")  # joins a load in flight
                key = (i, item.adapter)
                if key not in waiting_load:
                    result.adapter_loads += 1
                    waiting_load[key] = []
                # make_request needs the adapter registered: queue the item, make the request once loaded
                sreq = SimRequest(id=item.id, prompt_tokens=0, block_hashes=[], max_tokens=item.max_tokens,
                                  arrival_s=now, adapter=item.adapter)
                waiting_load[key].append(sreq)
            else:
                sreq = eng.make_request(request_id=item.id, prompt=item.prompt, max_tokens=item.max_tokens, now=now,
                                        adapter=item.adapter)
                eng.add(sreq)
            inflight[id(sreq)] = (req, i, item)
            if not busy[i]:
                schedule_step(i, now)
        elif kind == "step":
            i, step = payload
            assert isinstance(step, Step)
            finished: list[SimRequest] = engines[i].finish_step(step, now=now)
            for load in step.loads:
                if state is not None and hasattr(state, "add_adapter"):
                    state.add_adapter(endpoints[i].id, load.name)
                for placeholder in waiting_load.pop((i, load.name), []):
                    req, _, item = inflight.pop(id(placeholder))
                    sreq = engines[i].make_request(request_id=item.id, prompt=item.prompt,
                                                   max_tokens=item.max_tokens, now=placeholder.arrival_s,
                                                   adapter=item.adapter)
                    inflight[id(sreq)] = (req, i, item)
                    engines[i].add(sreq)
            for sreq in step.admitted:
                if sreq.ttft_s is not None:
                    result.ttft_s.append(sreq.ttft_s)
            for sreq in finished:
                req, _, item = inflight.pop(id(sreq))
                usage = Usage(prompt_tokens=sreq.prompt_tokens, completion_tokens=sreq.generated,
                              cached_tokens=sreq.cached_tokens)
                scheduler.on_complete(req, endpoints[i], ok=True, usage=usage)
                remaining -= 1
                for nxt in followers.pop(item.id, []):
                    heapq.heappush(events, (now + nxt.arrival_s, next(seq), "arrive", by_id[nxt.id]))
            schedule_step(i, now)
        elif kind == "scrape" and state is not None:
            for ep, eng in zip(endpoints, engines, strict=True):
                state.update(ep.id, waiting=len(eng.waiting), running=len(eng.running), kv_usage=eng.kv_usage,
                             kv_capacity_tokens=eng.profile.capacity_tokens)
                if eng.lora is not None and hasattr(state, "set_adapters"):
                    state.set_adapters(ep.id, eng.adapters(), as_of=now)
            heapq.heappush(events, (now + scrape_interval_s, next(seq), "scrape", None))
    result.makespan_s = now
    for eng in engines:
        result.prefix_queries += eng.counters.prefix_queries
        result.prefix_hits += eng.counters.prefix_hits
        result.output_tokens += eng.counters.generation_tokens
        result.busy_s += eng.counters.busy_s
        if eng.lora is not None:
            result.disk_loads += eng.lora.disk_loads
            result.slot_swaps += eng.lora.activations
    return result
