"""The LoRA configurations of `fleetgate bench cost --lora`: N fine-tunes as N deployments vs N adapters on
one shared base deployment, each layout sized by the same rule, and what its GPUs cost.

Layouts (every replica is a simulated vLLM engine with the cost benchmark's small-tier profile, an 8B
model on one L4 GPU at $0.80/h, `fleetgate.bench.cost_fleet`):
- `deployments`: fine-tune k is its own deployment serving model `ft-k` (merged weights, no LoRA).
- `adapters`: one base deployment (`--enable-lora --max-loras M --max-cpu-loras C`, runtime loading on)
  whose engines load `ft-k` as an adapter when the gateway first sends them a request for it.

Sizing (the same rule for every deployment of both layouts; no layout is sized by hand): a deployment's
offered work is cost_fleet's work model summed over the requests it will serve,

    work_s = uncached_prompt_tokens x prefill_s_per_token
             + output_tokens x (decode_s_per_seq + step_overhead_s / max_num_seqs)

(x (1 + lora_compute_overhead) on a LoRA-enabled base), with output tokens at the profile's mean natural
answer length and the fine-tune's system prompt counted as prefix-cached (its full blocks), as it is in
steady state on every engine in both layouts.
Replicas = max(1, ceil(work_s / (duration x target_utilisation))): whole replicas, enough for the load
at the target utilisation, and never fewer than one, because a fine-tune that has no replica cannot answer
(scale-to-zero trades that for a cold start of minutes, far past any TTFT target).

Cost: provisioned GPU time, replicas x GPUs per replica x $/GPU-hour x the workload's duration, per
1,000 requests. Unlike the main suite's work-only model (`cost_fleet`), it charges what a deployment keeps
running: that is exactly where one deployment per fine-tune loses, as each cold fine-tune pays for a
replica it barely uses, and where a shared base gains nothing once every fine-tune needs several replicas
of its own (`sizing_table` shows the saving shrinking as the load grows). The work actually done
(from the engines' counters, plus LoRA loads and swaps) is reported beside it, as utilisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetgate.bench.cost_fleet import default_deployments
from fleetgate.bench.workload import Workload
from fleetgate.sim.engine import SimRequest, count_tokens
from fleetgate.sim.fleet import SimFleet, start_sim_fleet
from fleetgate.sim.profile import SimProfile
from fleetgate.sim.server import render_chat

BASE_MODEL = "llama-3.1-8b"


@dataclass(frozen=True, slots=True)
class LoraSetup:
    """What both layouts share: the engine profile, the price, LoRA limits and the sizing target."""

    profile: SimProfile
    gpu_type: str
    gpus_per_replica: int
    usd_per_gpu_hour: float
    max_loras: int
    max_cpu_loras: int
    target_utilisation: float

    def lora_profile(self) -> SimProfile:
        return self.profile.with_(
            model=BASE_MODEL,
            enable_lora=True,
            max_loras=self.max_loras,
            max_cpu_loras=self.max_cpu_loras,
            allow_runtime_lora_updating=True,
        )

    def fine_tune_profile(self, name: str) -> SimProfile:
        return self.profile.with_(model=name)


def default_setup(
    *,
    time_scale: float,
    fine_tunes: int,
    max_loras: int = 4,
    max_cpu_loras: int | None = None,
    target_utilisation: float = 0.5,
) -> LoraSetup:
    small = default_deployments(time_scale=time_scale)[0]
    return LoraSetup(
        profile=small.profile,
        gpu_type=small.gpu_type,
        gpus_per_replica=small.gpus_per_replica,
        usd_per_gpu_hour=small.usd_per_gpu_hour,
        max_loras=max_loras,
        max_cpu_loras=max(max_loras, max_cpu_loras or fine_tunes),
        target_utilisation=target_utilisation,
    )


def request_work_s(profile: SimProfile, *, prompt_tokens: int, output_tokens: float) -> float:
    per_output = profile.decode_s_per_seq + profile.step_overhead_s / profile.max_num_seqs
    return prompt_tokens * profile.prefill_s_per_token + output_tokens * per_output


def offered_work(workload: Workload, setup: LoraSetup) -> dict[str, float]:
    """Replica-seconds of work per fine-tune (no LoRA overhead: `size_layouts` adds it for the shared base)."""
    p = setup.profile
    lo, hi = p.natural_tokens or (p.default_max_tokens, p.default_max_tokens)
    out: dict[str, float] = {}
    for item in workload.items:
        name = item.adapter or BASE_MODEL
        prompt = count_tokens(render_chat(list(item.messages)), chars_per_token=p.chars_per_token)
        if item.messages and item.messages[0].get("role") == "system":
            system = count_tokens(render_chat([item.messages[0]]), chars_per_token=p.chars_per_token)
            prompt -= min(prompt - 1, system // p.block_size * p.block_size)
        output = min(item.max_tokens, (lo + hi) / 2)
        out[name] = out.get(name, 0.0) + request_work_s(p, prompt_tokens=prompt, output_tokens=output)
    return out


def replicas_for(work_s: float, *, duration_s: float, target_utilisation: float) -> int:
    return max(1, math.ceil(work_s / (duration_s * target_utilisation)))


def size_layouts(workload: Workload, setup: LoraSetup, *, scale: float = 1.0) -> tuple[dict[str, int], int]:
    """(replicas per fine-tune deployment, replicas of the shared base) for the workload, its load
    multiplied by `scale`."""
    duration = workload.items[-1].at_s
    work = {name: w * scale for name, w in offered_work(workload, setup).items()}
    per_ft = {
        name: replicas_for(w, duration_s=duration, target_utilisation=setup.target_utilisation)
        for name, w in sorted(work.items())
    }
    lora_work = sum(work.values()) * (1 + setup.lora_profile().lora_compute_overhead)
    shared = replicas_for(lora_work, duration_s=duration, target_utilisation=setup.target_utilisation)
    return per_ft, shared


def sizing_table(workload: Workload, setup: LoraSetup, *, scales: tuple[float, ...] = (0.5, 1, 2, 4, 8, 16)) -> str:
    """GPUs each layout needs as the same mix's load grows, and the provisioned saving (no run: sizing only)."""
    lines = [f"{'load':>6} {'req/s':>7} {'GPUs: deployments':>18} {'GPUs: shared base':>18} {'saving':>7}"]
    rate = len(workload.items) / workload.items[-1].at_s
    for scale in scales:
        per_ft, shared = size_layouts(workload, setup, scale=scale)
        dep = sum(per_ft.values()) * setup.gpus_per_replica
        base = shared * setup.gpus_per_replica
        lines.append(f"{scale:>5g}x {rate * scale:>7.1f} {dep:>18} {base:>18} {1 - base / dep:>7.1%}")
    return "\n".join(lines)


@dataclass(slots=True)
class LoraFleet:
    """The running engines of one layout: deployment name -> fleet."""

    setup: LoraSetup
    fleets: dict[str, SimFleet] = field(default_factory=dict)
    engine_ttft_s: list[float] = field(default_factory=list)  # arrival at the engine -> first token, engine time

    def record_engine_ttft(self) -> None:
        """Also collect each engine's own TTFT (no gateway, no client, no machine noise in it)."""
        for fleet in self.fleets.values():
            for engine in fleet.engines:
                previous = engine.on_first_token

                def observe(req: SimRequest, previous: Callable[[SimRequest], None] | None = previous) -> None:
                    if previous is not None:
                        previous(req)
                    if req.ttft_s is not None:
                        self.engine_ttft_s.append(req.ttft_s)

                engine.on_first_token = observe

    async def aclose(self) -> None:
        for fleet in self.fleets.values():
            await fleet.aclose()

    @property
    def replicas(self) -> int:
        return sum(len(f.engines) for f in self.fleets.values())

    def provisioned_usd(self, *, duration_s: float) -> float:
        s = self.setup
        return self.replicas * s.gpus_per_replica * s.usd_per_gpu_hour * duration_s / 3600.0

    def work_s(self) -> float:
        """Replica-seconds of work done: cost_fleet's token model from the engines' counters, with the
        LoRA compute overhead, adapter loads and slot swaps on LoRA engines."""
        total = 0.0
        for fleet in self.fleets.values():
            for e in fleet.engines:
                p, c = e.profile, e.counters
                work = request_work_s(
                    p, prompt_tokens=c.prompt_tokens - c.prefix_hits, output_tokens=c.generation_tokens
                )
                if e.lora is not None:
                    work = (
                        work * (1 + p.lora_compute_overhead)
                        + e.lora.disk_loads * p.lora_load_s
                        + e.lora.activations * p.lora_activate_s
                    )
                total += work
        return total

    def lora_counts(self) -> tuple[int, int]:
        """(adapter loads from disk, GPU slot swaps) over the layout's engines."""
        loads = swaps = 0
        for fleet in self.fleets.values():
            for e in fleet.engines:
                if e.lora is not None:
                    loads += e.lora.disk_loads
                    swaps += e.lora.activations
        return loads, swaps


async def start_layout(setup: LoraSetup, *, shared: bool, per_ft: dict[str, int], shared_replicas: int) -> LoraFleet:
    fleet = LoraFleet(setup=setup)
    try:
        if shared:
            fleet.fleets[BASE_MODEL] = await start_sim_fleet(replicas=shared_replicas, profile=setup.lora_profile())
        else:
            for name, replicas in per_ft.items():
                fleet.fleets[name] = await start_sim_fleet(replicas=replicas, profile=setup.fine_tune_profile(name))
    except BaseException:
        await fleet.aclose()
        raise
    fleet.record_engine_ttft()
    return fleet
