"""vLLM's own token and prefix-cache counters from its `/metrics` text, and their change over an interval.

A benchmark point reads every engine's counters before and after (`snapshot`), and its figures are the
differences (`CounterSnapshot.minus`): the engines' word on what they did, not the client's. Read here:

- `vllm:prompt_tokens_total`: prompt tokens of requests whose prefill completed (vLLM counts a request's
  prompt when its first token comes out, so a request aborted while queued or prefilling adds nothing);
- `vllm:generation_tokens_total`: tokens generated (outputs of a request already aborted are not counted);
- `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`: prompt tokens looked up in the prefix
  cache and found there (the hit rate of a point is hits / queries of its deltas);
- `vllm:request_success_total`: finished requests (all `finished_reason` labels);
- `vllm:num_preemptions_total`: requests preempted for lack of KV blocks;
- `vllm:cache_config_info`: `num_gpu_blocks` x `block_size` = the KV capacity in tokens.

Series are summed over their label sets (`engine`, `model_name`, `finished_reason`): a server with several
data-parallel engines is one endpoint. `_created` samples are ignored. Only lines of these families are
parsed (a vLLM exposition holds hundreds of series). A counter that went down between two snapshots means
the engine restarted: `minus` raises `CounterResetError` rather than report a negative or partial delta.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

COUNTERS: dict[str, str] = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prefix_cache_queries": "prefix_queries",
    "vllm:prefix_cache_hits": "prefix_hits",
    "vllm:request_success": "requests_finished",
    "vllm:num_preemptions": "preemptions",
}
CAPACITY = "vllm:cache_config_info"


class CounterResetError(RuntimeError):
    """A counter decreased between two snapshots: the engine restarted in between."""


@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    requests_finished: float = 0.0
    preemptions: float = 0.0
    kv_capacity_tokens: int = 0  # a gauge of the configuration, not a counter: kept, never differenced

    def minus(self, before: CounterSnapshot, *, engine: str = "engine") -> CounterSnapshot:
        """The counters' change since `before`."""
        changes: dict[str, float] = {}
        for f in fields(self):
            if f.name == "kv_capacity_tokens":
                continue
            now, then = getattr(self, f.name), getattr(before, f.name)
            if now < then:
                raise CounterResetError(f"{engine}: {f.name} went from {then:g} to {now:g} (engine restarted?)")
            changes[f.name] = now - then
        return CounterSnapshot(**changes, kv_capacity_tokens=self.kv_capacity_tokens)

    def plus(self, other: CounterSnapshot) -> CounterSnapshot:
        """Two engines' snapshots (or deltas) added up; capacities add too."""
        values = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return CounterSnapshot(**values)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def uncached_prompt_tokens(self) -> float:
        """Prompt tokens the engine computed (prefilled) rather than found in its prefix cache."""
        return max(0.0, self.prompt_tokens - self.prefix_hits)


def parse_counters(text: str) -> CounterSnapshot:
    """The counters of one engine's `/metrics` exposition (zeros for families it does not export)."""
    wanted = (*COUNTERS, CAPACITY)
    lines = [ln for ln in text.splitlines() if ln.startswith(wanted) or ln.startswith("# TYPE vllm:")]
    values = dict.fromkeys(COUNTERS.values(), 0.0)
    capacity = 0
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")
            if name in COUNTERS:
                values[COUNTERS[name]] += sample.value
            elif sample.name == CAPACITY:
                with contextlib.suppress(KeyError, ValueError):
                    capacity += int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
    return CounterSnapshot(**values, kv_capacity_tokens=capacity)


def total(snapshots: list[CounterSnapshot]) -> CounterSnapshot:
    out = CounterSnapshot()
    for s in snapshots:
        out = out.plus(s)
    return out


def deltas(before: list[CounterSnapshot], after: list[CounterSnapshot], *, names: list[str] | None = None
           ) -> list[CounterSnapshot]:
    """Per-engine changes between two lists of snapshots taken of the same engines in the same order."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} snapshots before, {len(after)} after")
    labels = names or [f"engine-{i}" for i in range(len(after))]
    return [a.minus(b, engine=n) for a, b, n in zip(after, before, labels, strict=True)]
