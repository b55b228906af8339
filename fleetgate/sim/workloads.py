"""Seeded routing workloads, defined in code so anyone can rerun them.

Text is drawn from a fixed vocabulary with `random.Random(seed)`; at the simulator's ~4 characters
per token, `_text(n_tokens)` yields about n tokens. A real tokenizer reads these words at another ratio:
pass its measured `chars_per_token` (the live benchmarks measure it on the engine first) and the
prompts hold about the asked number of its tokens. Arrivals are Poisson at `rate_rps`.

- `shared_prefix`: G groups x N prompts. Each group has its own long system prompt
  (`prefix_tokens`, default 2,048) and every prompt a short unique question (`question_tokens`,
  128). Requests of all groups are interleaved at random. Size G so that G * prefix_tokens is 2-3x
  one replica's KV capacity: then no replica can hold every hot prefix, and where requests go decides
  the cache hit rate.
- `multi_round_chat`: U users x R rounds over one shared system prompt. Round r+1 of a user is sent
  `think_s` after round r completes (closed loop), with the growing history (questions and fixed-length
  answers) in the prompt; each user has a session key.
- `unique_prompts`: no sharing at all, random lengths; the guard against regressions.
- `sized_items`: the live benchmarks' points: one of the first three, sized in engine tokens (`Sizes`) from
  one engine's KV capacity and cut to a window (see `fleetgate.bench.live_workloads`).
- `adapter_mix`: N LoRA fine-tunes of one base (`ft-0` .. `ft-{N-1}`), chosen per request with Zipf
  popularity (exponent `zipf_s`; ft-0 hottest); each has its own system prompt and every request a unique
  question, Poisson arrivals. What adapter-affinity routing is compared on.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

_WORDS = [
    "gpu",
    "kernel",
    "cache",
    "token",
    "batch",
    "prefill",
    "decode",
    "tensor",
    "shard",
    "replica",
    "gateway",
    "tenant",
    "budget",
    "latency",
    "throughput",
    "queue",
    "block",
    "page",
    "memory",
    "model",
    "layer",
    "weight",
    "router",
    "policy",
    "metric",
    "health",
    "probe",
    "pod",
    "node",
    "cluster",
    "service",
    "stream",
    "request",
    "answer",
    "prompt",
    "context",
    "window",
    "vector",
    "index",
    "score",
    "filter",
    "picker",
    "profile",
    "config",
    "secret",
    "volume",
    "quota",
    "limit",
    "scale",
    "deploy",
    "rollout",
    "canary",
    "trace",
    "span",
    "log",
    "alert",
]


def _text(rng: random.Random, n_tokens: int, *, chars_per_token: int | float = 4) -> str:
    target = round(n_tokens * chars_per_token)
    parts: list[str] = []
    size = 0
    while size < target:
        w = rng.choice(_WORDS)
        parts.append(w)
        size += len(w) + 1
    return " ".join(parts)[:target]


@dataclass(frozen=True, slots=True)
class WorkItem:
    id: str
    prompt: str
    max_tokens: int
    arrival_s: float  # open-loop arrival time; for chat rounds > 0, the delay after the previous round
    session_key: str | None = None
    after: str | None = None  # id of the item that must complete first (closed-loop chat rounds)
    group: str = ""
    adapter: str | None = None  # a LoRA adapter of the base model; None: the base model itself


def _arrivals(rng: random.Random, n: int, rate_rps: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_rps)
        out.append(t)
    return out


def shared_prefix(
    *,
    seed: int,
    groups: int = 24,
    prompts_per_group: int = 16,
    prefix_tokens: int = 2048,
    question_tokens: int = 128,
    max_tokens: int = 32,
    rate_rps: float = 0.6,
    chars_per_token: int | float = 4,
) -> list[WorkItem]:
    rng = random.Random(seed)
    cpt = chars_per_token
    prefixes = [f"[group {g}] " + _text(rng, prefix_tokens, chars_per_token=cpt) for g in range(groups)]
    order = [g for g in range(groups) for _ in range(prompts_per_group)]
    rng.shuffle(order)
    times = _arrivals(rng, len(order), rate_rps)
    return [
        WorkItem(
            id=f"sp-{i}",
            prompt=f"{prefixes[g]}\nQuestion {i}: {_text(rng, question_tokens, chars_per_token=cpt)}",
            max_tokens=max_tokens,
            arrival_s=times[i],
            group=f"g{g}",
        )
        for i, g in enumerate(order)
    ]


def multi_round_chat(
    *,
    seed: int,
    users: int = 32,
    rounds: int = 6,
    system_tokens: int = 1024,
    turn_tokens: int = 96,
    answer_tokens: int = 64,
    max_tokens: int = 64,
    think_s: float = 5.0,
    start_rate_rps: float = 0.5,
    chars_per_token: int | float = 4,
) -> list[WorkItem]:
    rng = random.Random(seed)
    cpt = chars_per_token
    system = "<system> " + _text(rng, system_tokens, chars_per_token=cpt)
    starts = _arrivals(rng, users, start_rate_rps)
    items: list[WorkItem] = []
    for u in range(users):
        history = system
        prev: str | None = None
        for r in range(rounds):
            history += f"\n<user {u}> " + _text(rng, turn_tokens, chars_per_token=cpt)
            item_id = f"chat-{u}-{r}"
            items.append(
                WorkItem(
                    id=item_id,
                    prompt=history,
                    max_tokens=max_tokens,
                    arrival_s=starts[u] if prev is None else think_s,
                    session_key=f"user-{u}",
                    after=prev,
                    group=f"u{u}",
                )
            )
            history += "\n<assistant> " + _text(rng, answer_tokens, chars_per_token=cpt)
            prev = item_id
    return items


def unique_prompts(
    *,
    seed: int,
    n: int = 384,
    min_tokens: int = 256,
    max_prompt_tokens: int = 2048,
    max_tokens: int = 32,
    rate_rps: float = 0.6,
    chars_per_token: int | float = 4,
) -> list[WorkItem]:
    rng = random.Random(seed)
    times = _arrivals(rng, n, rate_rps)
    return [
        WorkItem(
            id=f"u-{i}",
            prompt=f"{i} " + _text(rng, rng.randint(min_tokens, max_prompt_tokens), chars_per_token=chars_per_token),
            max_tokens=max_tokens,
            arrival_s=times[i],
        )
        for i in range(n)
    ]


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n, proportional to 1 / rank^s, normalised to sum to 1."""
    raw = [1.0 / (rank**s) for rank in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def adapter_mix(
    *,
    seed: int,
    n: int = 600,
    adapters: int = 8,
    zipf_s: float = 1.1,
    system_tokens: int = 256,
    question_tokens: int = 48,
    max_tokens: int = 48,
    rate_rps: float = 4.0,
) -> list[WorkItem]:
    rng = random.Random(seed)
    names = [f"ft-{k}" for k in range(adapters)]
    systems = {name: f"<system {name}> " + _text(rng, system_tokens) for name in names}
    weights = zipf_weights(adapters, zipf_s)
    times = _arrivals(rng, n, rate_rps)
    items = []
    for i in range(n):
        name = rng.choices(names, weights=weights)[0]
        items.append(WorkItem(id=f"lora-{i}", prompt=f"{systems[name]}\n<user> {i} " + _text(rng, question_tokens),
                              max_tokens=max_tokens, arrival_s=times[i], group=name, adapter=name))
    return items


LIVE_WORKLOADS = ("shared-prefix", "chat", "unique")


@dataclass(frozen=True, slots=True)
class Sizes:
    prefix_tokens: int = 2048
    question_tokens: int = 96
    output_tokens: int = 64
    hot_factor: float | None = None  # None: min(2.5, 0.75 x replicas)
    tenants: int = 8
    chat_system_tokens: int = 1024
    chat_turn_tokens: int = 96
    chat_rounds: int = 6
    chat_think_s: float = 1.0
    unique_min_tokens: int = 256
    unique_max_tokens: int = 2048

    def hot(self, replicas: int) -> float:
        return self.hot_factor if self.hot_factor is not None else min(2.5, 0.75 * replicas)

    def groups(self, *, capacity_tokens: int, replicas: int) -> int:
        return max(2, math.ceil(self.hot(replicas) * capacity_tokens / self.prefix_tokens))


def sized_items(workload: str, *, seed: int, rate: float, window_s: float, sizes: Sizes, chars_per_token: float,
              capacity_tokens: int, replicas: int, users: int = 0) -> list[WorkItem]:
    """The work items of one point, arrivals within `window_s` (chat: users starting within it)."""
    cpt = chars_per_token
    if workload == "shared-prefix":
        groups = sizes.groups(capacity_tokens=capacity_tokens, replicas=replicas)
        expected = rate * window_s
        per_group = max(2, math.ceil(1.5 * expected / groups) + 2)
        items = shared_prefix(seed=seed, groups=groups, prompts_per_group=per_group,
                                        prefix_tokens=sizes.prefix_tokens, question_tokens=sizes.question_tokens,
                                        max_tokens=sizes.output_tokens, rate_rps=rate, chars_per_token=cpt)
        return [it for it in items if it.arrival_s < window_s]
    if workload == "unique":
        n = max(4, math.ceil(1.5 * rate * window_s) + 4)
        items = unique_prompts(seed=seed, n=n, min_tokens=sizes.unique_min_tokens,
                                         max_prompt_tokens=sizes.unique_max_tokens, max_tokens=sizes.output_tokens,
                                         rate_rps=rate, chars_per_token=cpt)
        return [it for it in items if it.arrival_s < window_s]
    if workload == "chat":
        return multi_round_chat(seed=seed, users=max(1, users), rounds=sizes.chat_rounds,
                                          system_tokens=sizes.chat_system_tokens, turn_tokens=sizes.chat_turn_tokens,
                                          answer_tokens=sizes.output_tokens, max_tokens=sizes.output_tokens,
                                          think_s=sizes.chat_think_s, start_rate_rps=rate, chars_per_token=cpt)
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(LIVE_WORKLOADS)}")
