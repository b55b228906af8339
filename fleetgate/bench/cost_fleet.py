"""The simulated two-tier fleet the cost benchmark runs on, and what its GPUs cost.

Two deployments, each a set of simulated vLLM replicas (`fleetgate.sim`):
- small: an 8B-class model, one GPU per replica (cheap GPU);
- large: a 70B-class model with tensor parallelism 4, four GPUs per replica.

Cost model: GPU-seconds of work at full batch. Each replica's own counters give the uncached prompt
tokens it prefilled and the tokens it generated; with the simulator's step-time model
(`fleetgate.sim.profile`) that work costs

    work_s = uncached_prompt_tokens x prefill_s_per_token
             + generated_tokens x (decode_s_per_seq + step_overhead_s / max_num_seqs)

seconds of a replica, i.e. what a fleet right-sized by the autoscaler (running full batches) pays for
this workload; `$ = work_s x gpus_per_replica x $/GPU-hour / 3600`. Wall-clock busy time is not used:
on a half-idle fixed fleet it charges light load for small, inefficient batches, which says more about
the fleet's size than about the gateway's decisions compared here. Prefix-cache hits lower the first
term, response-cache hits and tiering lower both.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.sim.fleet import SimFleet, start_sim_fleet
from fleetgate.sim.profile import SimProfile


@dataclass(frozen=True, slots=True)
class TierDeployment:
    tier: str
    profile: SimProfile
    replicas: int
    gpu_type: str
    gpus_per_replica: int
    usd_per_gpu_hour: float

    @property
    def model(self) -> str:
        return self.profile.model


def default_deployments(*, time_scale: float) -> tuple[TierDeployment, TierDeployment]:
    """Prices are typical on-demand cloud rates (late 2026): L4 ~$0.80/h, H100 ~$4/h per GPU."""
    small = SimProfile(
        name="bench-8b", model="llama-3.1-8b", num_blocks=2048, max_num_seqs=64, max_batched_tokens=8192,
        step_overhead_s=0.012, prefill_s_per_token=0.00012, decode_s_per_seq=0.0004,
        default_max_tokens=64, time_scale=time_scale, natural_tokens=(20, 160), answer_tag=True,
    )
    large = SimProfile(
        name="bench-70b-tp4", model="llama-3.1-70b", num_blocks=2048, max_num_seqs=64, max_batched_tokens=8192,
        step_overhead_s=0.03, prefill_s_per_token=0.0004, decode_s_per_seq=0.0012,
        default_max_tokens=64, time_scale=time_scale, natural_tokens=(20, 160), answer_tag=True,
    )
    return (
        TierDeployment(tier="small", profile=small, replicas=2, gpu_type="nvidia-l4", gpus_per_replica=1,
                       usd_per_gpu_hour=0.80),
        TierDeployment(tier="large", profile=large, replicas=4, gpu_type="nvidia-h100", gpus_per_replica=4,
                       usd_per_gpu_hour=4.00),
    )


@dataclass(slots=True)
class RunningFleet:
    deployments: tuple[TierDeployment, ...]
    fleets: dict[str, SimFleet]  # tier -> fleet

    async def aclose(self) -> None:
        for fleet in self.fleets.values():
            await fleet.aclose()

    def reset_counters(self) -> None:
        """Forget the warm-up: counters start from zero (KV caches keep what warm-up left, which is little)."""
        from fleetgate.sim.engine import EngineCounters

        for fleet in self.fleets.values():
            for engine in fleet.engines:
                engine.counters = EngineCounters()

    def work_seconds(self) -> dict[str, float]:
        """Replica-seconds of work per tier (see the module docstring)."""
        out: dict[str, float] = {}
        for d in self.deployments:
            p = d.profile
            per_output = p.decode_s_per_seq + p.step_overhead_s / p.max_num_seqs
            total = 0.0
            for e in self.fleets[d.tier].engines:
                c = e.counters
                total += (c.prompt_tokens - c.prefix_hits) * p.prefill_s_per_token + c.generation_tokens * per_output
            out[d.tier] = total
        return out

    def gpu_seconds(self) -> dict[str, float]:
        work = self.work_seconds()
        return {d.tier: work[d.tier] * d.gpus_per_replica for d in self.deployments}

    def dollars(self) -> dict[str, float]:
        gpu_s = self.gpu_seconds()
        return {d.tier: gpu_s[d.tier] * d.usd_per_gpu_hour / 3600.0 for d in self.deployments}

    def prefix_hit_rate(self) -> float:
        queries = hits = 0
        for fleet in self.fleets.values():
            for engine in fleet.engines:
                queries += engine.counters.prefix_queries
                hits += engine.counters.prefix_hits
        return hits / queries if queries else 0.0

    def engine_calls(self) -> dict[str, int]:
        return {d.tier: sum(e.counters.requests_started for e in self.fleets[d.tier].engines)
                for d in self.deployments}


async def start_fleet(deployments: tuple[TierDeployment, ...]) -> RunningFleet:
    fleets: dict[str, SimFleet] = {}
    try:
        for d in deployments:
            fleets[d.tier] = await start_sim_fleet(replicas=d.replicas, profile=d.profile)
    except BaseException:
        for fleet in fleets.values():
            await fleet.aclose()
        raise
    return RunningFleet(deployments=deployments, fleets=fleets)
