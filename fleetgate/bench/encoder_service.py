"""`fleetgate bench encoder-service`: an encoder service's own throughput (texts/s) and latency.

What the semantic cache asks of its encoder service (`semantic.embedder: remote`): `POST /v1/embeddings` with
MiniLM token ids, base64 float32 back. The texts are the varied workload's questions (`bench gateway`'s
`lookup miss (varied)`), spelling-corrected and tokenised as the gateway does, never the same one twice.

Phases, each `--duration` seconds (closed loop: each client sends its next request when the last answered):
- `1 x 1 text`: one client, one text a request: the round trip a lone lookup waits for (p50/p99);
- `C x 1 text`: `--concurrency` clients, one text each: many gateways' lone lookups at once;
- `C x B texts`: `--concurrency` clients, batches of `--batch`: what a busy gateway's batcher sends.
Per phase: requests and texts per second, request latency p50/p99 (client side: the HTTP round trip on
loopback or the network, the service's queue and its forward pass), errors. Every answer is checked as the
cache checks it (`fleetgate.cache.remote_encoder.parse_vectors`). With `--json PATH` the figures are written too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class ServicePhase:
    name: str
    clients: int
    batch: int
    requests: int = 0
    texts: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies) * 1000 if self.latencies else np.zeros(1)
        out = {k: v for k, v in asdict(self).items() if k != "latencies"}
        out.update(requests_per_s=self.requests / self.seconds if self.seconds else 0.0,
                   texts_per_s=self.texts / self.seconds if self.seconds else 0.0,
                   p50_ms=float(np.percentile(lat, 50)), p99_ms=float(np.percentile(lat, 99)))
        return out


class Texts:
    """The varied questions as the gateway sends them: token ids of the spelling-corrected text."""

    def __init__(self) -> None:
        from fleetgate.core.minilm import minilm_dir
        from fleetgate.core.minilm_onnx import minilm_tokenizer

        self._tokenizer = minilm_tokenizer(minilm_dir())
        self._n = 0

    def take(self, count: int) -> list[list[int]]:
        from fleetgate.bench.loadgen import varied_prompt
        from fleetgate.cache.textnorm import embedding_text

        texts = [embedding_text(varied_prompt(self._n + i)) for i in range(count)]
        self._n += count
        return [e.ids for e in self._tokenizer.encode_batch(texts)]


async def run_phase(url: str, model: str, texts: Texts, *, name: str, clients: int, batch: int,
                    duration_s: float) -> ServicePhase:
    import aiohttp

    from fleetgate.cache.remote_encoder import EncoderUnavailable, parse_vectors

    phase = ServicePhase(name=name, clients=clients, batch=batch)
    # each phase's texts ready beforehand: tokenising must not slow the clients down
    pool = texts.take(min(20_000, max(batch, int(clients * batch * duration_s * 400))))
    deadline = time.perf_counter() + duration_s
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def client(first: int) -> None:
            i = first
            while time.perf_counter() < deadline:
                ids = [pool[(i + k) % len(pool)] for k in range(batch)]
                i += clients * batch
                body = json.dumps({"model": model, "input": ids, "encoding_format": "base64"})
                t0 = time.perf_counter()
                try:
                    async with session.post(url + "/v1/embeddings", data=body,
                                            headers={"Content-Type": "application/json"}) as r:
                        raw = await r.read()
                        ok = r.status == 200
                    if ok:
                        parse_vectors(raw, count=batch)
                except (aiohttp.ClientError, EncoderUnavailable, TimeoutError):
                    ok = False
                if ok:
                    phase.requests += 1
                    phase.texts += batch
                    phase.latencies.append(time.perf_counter() - t0)
                else:
                    phase.errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(client(c * batch) for c in range(clients)))
        phase.seconds = time.perf_counter() - start
    return phase


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the encoder service's base URL (no /v1)")
    parser.add_argument("--model", default="all-minilm-l6-v2", help="its served model name")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--concurrency", type=int, default=64, help="clients in the concurrent phases")
    parser.add_argument("--batch", type=int, default=32, help="texts per request in the batched phase")
    parser.add_argument("--json", help="also write the figures to this file")


async def _measure(args: argparse.Namespace) -> list[ServicePhase]:
    texts = Texts()
    await run_phase(args.url, args.model, texts, name="warm-up", clients=4, batch=8, duration_s=1.0)
    plan = [("1 x 1 text", 1, 1), (f"{args.concurrency} x 1 text", args.concurrency, 1),
            (f"{args.concurrency} x {args.batch} texts", args.concurrency, args.batch)]
    return [await run_phase(args.url, args.model, texts, name=name, clients=clients, batch=batch,
                            duration_s=args.duration) for name, clients, batch in plan]


def run(args: argparse.Namespace) -> int:
    phases = asyncio.run(_measure(args))
    print(f"fleetgate bench encoder-service  {args.url} ({args.model}), {args.duration:g} s a phase, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"  {'phase':<22} {'texts/s':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    rows = [p.summary() for p in phases]
    for row in rows:
        print(f"  {row['name']:<22} {row['texts_per_s']:9.0f} {row['requests_per_s']:8.0f} {row['p50_ms']:8.2f} "
              f"{row['p99_ms']:8.2f} {row['errors']:6d}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=2)
    return 0 if all(p.requests and not p.errors for p in phases) else 1
