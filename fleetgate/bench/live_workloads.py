"""The live benchmark's workloads in engine tokens, sized from the engines, as requests to send.

Built on the seeded generators of `fleetgate.sim.workloads` (same seed, same requests), with the
engine tokenizer's measured characters per token so the prompts hold about the asked number of its
tokens. Every request asks for exactly `output_tokens` tokens (`ignore_eos`).

- `shared-prefix`: G long system prompts, `prefix_tokens` each, shared by the requests of a group, plus a
  unique question; groups belong to tenants (`g mod tenants`). G is sized from one engine's KV capacity:
  G x prefix_tokens = `hot_factor` x capacity, where `hot_factor` defaults to min(2.5, 0.75 x replicas):
  more than one engine can hold, while a prefix-aware split still fits the fleet. Poisson arrivals at
  `rate` for `window_s`.
- `chat`: `users` conversations over one shared system prompt, `rounds` turns each; a user's next turn is
  sent `think_s` after its answer ends (closed loop), with the whole history, and the user's id as the
  OpenAI `user` field (the gateway's session key). Users start at `rate` per second.
- `unique`: no sharing; prompt lengths uniform in [unique_min_tokens, unique_max_tokens].
`cancel_share`: that share of requests (seeded choice) leaves after a random number of chunks in
[1, output_tokens - 1]: cancellations mid-stream.
Requests to a door of several gateway replicas (`Target.door_urls`) go to them in turn (request i to replica
i mod N), as a Kubernetes Service spreads new connections.

- `reference_chains`: issue 24's reference scale as a background (the overhead phase's `reference`): a closed loop
  of `streams` clients, each sending one request after another with no think time; every prompt unique from its
  first characters (no prefix shared between requests) of about `prompt_tokens`, every answer exactly
  `output_tokens` long.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fleetgate.bench.live_client import LiveRequest, completion_body
from fleetgate.sim.workloads import Sizes, WorkItem, _text, sized_items

__all__ = ["Sizes", "Target", "reference_chains", "sized_items", "tenant_of", "to_requests"]

REFERENCE_MIN_REQUEST_S = 0.5  # no reference request is expected to end sooner: a chain covers the window
REFERENCE_STAGGER_S = 0.5  # the chains' first requests are spread over this span (not one burst at t=0)


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: the gateway (with tenant keys) or straight to the engines (client round-robin)."""

    url: str
    model: str
    keys: dict[str, str]  # tenant -> API key (gateway); empty for direct
    engine_urls: tuple[str, ...] = ()  # direct: the engines, taken in turn
    door_urls: tuple[str, ...] = ()  # a door of several gateway replicas: taken in turn, as a Service spreads them

    def url_of(self, i: int) -> str:
        """Where the i-th request goes."""
        if self.engine_urls:
            return self.engine_urls[i % len(self.engine_urls)]
        return self.door_urls[i % len(self.door_urls)] if self.door_urls else self.url

    def headers(self, tenant: str) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.keys:
            h["Authorization"] = f"Bearer {self.keys[tenant]}"
        return h


def tenant_of(item: WorkItem, tenants: int) -> str:
    digits = "".join(ch for ch in item.group if ch.isdigit())
    index = int(digits) if digits else int(item.id.rsplit("-", 1)[-1])
    return f"t{index % tenants}"


def to_requests(items: list[WorkItem], *, target: Target, tenants: int, cancel_share: float = 0.0,
                seed: int = 0, output_tokens: int = 64, path: str = "gateway") -> list[LiveRequest]:
    """LiveRequests for `items` (closed-loop chains kept), `cancel_share` of them leaving mid-stream."""
    rng = random.Random(f"cancel:{seed}")
    out = []
    for i, item in enumerate(items):
        tenant = tenant_of(item, tenants)
        cancel = rng.randint(1, max(1, output_tokens - 1)) if rng.random() < cancel_share else None
        url = target.url_of(i)
        body = completion_body(model=target.model, prompt=item.prompt, max_tokens=item.max_tokens,
                               user=item.session_key)
        out.append(LiveRequest(id=item.id, url=url, body=body, headers=target.headers(tenant), at_s=item.arrival_s,
                               after=item.after, cancel_after=cancel, tenant=tenant, group=item.group, path=path))
    return out


def reference_chains(*, streams: int, window_s: float, target: Target, tenants: list[str], chars_per_token: float,
                     seed: int, prompt_tokens: int = 1000, output_tokens: int = 128) -> list[LiveRequest]:
    """`streams` closed-loop chains (each request sent when the one before it in its chain ends, `at_s` 0), long
    enough to outlast `window_s` (a request takes at least `REFERENCE_MIN_REQUEST_S`; `replay` sends no follower
    past its `send_until_s`, so the excess is never sent). Chain c's first request leaves at
    c / streams x `REFERENCE_STAGGER_S`. Request i in sending order (round j of chain c: i = j x streams + c) goes to
    the door's replica i mod N and belongs to tenant i mod T, as `to_requests` spreads requests; its prompt starts
    with its own tag, so no two requests share a prefix block."""
    if streams < 1:
        raise ValueError(f"the reference background needs at least one stream, got {streams}")
    rounds = math.ceil(window_s / REFERENCE_MIN_REQUEST_S) + 2
    rng = random.Random(f"reference:{seed}")
    out = []
    for c in range(streams):
        previous: str | None = None
        for j in range(rounds):
            i = j * streams + c
            tenant = tenants[i % len(tenants)]
            rid = f"ref-{c}-{j}"
            prompt = f"[{rid}] " + _text(rng, prompt_tokens, chars_per_token=chars_per_token)
            body = completion_body(model=target.model, prompt=prompt, max_tokens=output_tokens)
            out.append(LiveRequest(id=rid, url=target.url_of(i), body=body, headers=target.headers(tenant),
                                   at_s=c / streams * REFERENCE_STAGGER_S if previous is None else 0.0,
                                   after=previous, tenant=tenant, group=f"ref-{c}"))
            previous = rid
    return out
