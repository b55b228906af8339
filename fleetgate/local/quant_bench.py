"""`fleetgate bench engine --compare w4a16,w8a8`: bf16 and quantized Gemma 3 270M, one engine at a time, one run.

For bf16 (the baseline) and each scheme, on the same machine in the same run (engines start one after
the other, each stopped before the next starts):
- weights: bytes of the checkpoint's safetensors files (what the engine loads), and in memory as the
  engine's worker reports them (`fleetgate.local.vllm_plugin`, `$FLEETGATE_LOG_WEIGHT_BYTES`): the bytes
  of the loaded model's tensors, and the worker's RSS and anonymous-RSS growth over the load (vLLM CPU logs
  no weight memory; see `fleetgate.local.vllm_weights`);
- memory: RSS and PSS summed over the engine's process group once it has served requests;
- start-up: launch -> `/health` 200 with the model listed;
- TTFT of a short prompt; decode tokens/s of one stream and aggregate tokens/s of 4 streams;
- quality: greedy agreement with bf16 on short prompts: for each prompt, the share of positions at which the
  quantized model's greedy token equals bf16's, counted up to the first divergence (after which the two
  continue from different texts) over `--agreement-tokens` tokens, averaged over the prompts.
Printed as figures and as ratios against bf16.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetgate.local.config import EngineConfig
from fleetgate.local.engine_bench import MODEL, decode_rate, group_memory_mib, stream_times
from fleetgate.local.engines import EngineFleet
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.vllm_command import vllm_specs
from fleetgate.local.vllm_weights import WEIGHT_BYTES_ENV, parse_weight_bytes

BASELINE = "none"
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Water boils at a temperature of",
    "To make a cup of tea, first",
    "The three primary colours are",
    "A good way to learn a new language is",
    "The largest planet in our solar system is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The main ingredients of bread are",
    "In summary, the benefits of regular exercise are",
)


def greedy_tokens(url: str, *, prompt: str, max_tokens: int) -> list[str]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as response:
        data = json.loads(response.read())
    return [str(t) for t in data["choices"][0]["logprobs"]["tokens"]]


def agreement(reference: list[str], other: list[str]) -> float:
    """Share of `reference` positions matched by `other` before the first divergence."""
    same = 0
    for a, b in zip(reference, other, strict=False):
        if a != b:
            break
        same += 1
    return same / max(1, len(reference))


def _weights_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def measure(*, scheme: str, max_tokens: int, agreement_tokens: int) -> dict[str, Any]:
    quantization = None if scheme == BASELINE else scheme
    model_path = prepare_model(quantization=quantization)
    logs = Path(tempfile.mkdtemp(prefix=f"fleetgate-quant-bench-{scheme}-"))
    config = EngineConfig(
        base_port=0,
        max_model_len=2048,
        quantization=scheme,  # type: ignore[arg-type]  # checked against QUANTIZATIONS by the CLI
        log_dir=logs,
        env={WEIGHT_BYTES_ENV: "1"},
    )
    out: dict[str, Any] = {"weights_bytes": _weights_bytes(model_path)}
    with EngineFleet(specs=vllm_specs(config=config, model_path=model_path)) as fleet:
        out["engine_start_s"] = fleet.start()
        reported = parse_weight_bytes((logs / "engine-0.log").read_text(errors="replace"))
        nan = float("nan")
        out["weights_tensor_bytes"], out["weights_rss_bytes"], out["weights_anon_bytes"] = reported or (nan, nan, nan)
        url, pgid = fleet.urls[0], fleet.processes[0].pid
        out["greedy"] = [greedy_tokens(url, prompt=p, max_tokens=agreement_tokens) for p in PROMPTS]
        start, arrivals = stream_times(url, prompt="Once upon a time", max_tokens=max_tokens)
        out["ttft_s"] = arrivals[0] - start
        out["decode_tok_s_1_stream"] = decode_rate(arrivals)
        results: list[list[float]] = []

        def one(i: int) -> None:
            results.append(stream_times(url, prompt=f"Story {i}: once upon a time", max_tokens=max_tokens)[1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["decode_tok_s_4_streams"] = sum(len(r) for r in results) / (time.monotonic() - t)
        memory = group_memory_mib(pgid)
        out["rss_mib"], out["pss_mib"] = memory["rss"], memory["pss"]
    return out


def run_compare(*, schemes: list[str], max_tokens: int, agreement_tokens: int, as_json: bool) -> int:
    figures: dict[str, dict[str, Any]] = {}
    for scheme in [BASELINE, *schemes]:
        figures[scheme] = measure(scheme=scheme, max_tokens=max_tokens, agreement_tokens=agreement_tokens)
    base = figures[BASELINE]
    for fig in figures.values():
        pairs = zip(base["greedy"], fig["greedy"], strict=True)
        fig["greedy_agreement"] = sum(agreement(a, b) for a, b in pairs) / len(PROMPTS)
        for key in (
            "weights_bytes",
            "weights_tensor_bytes",
            "weights_rss_bytes",
            "weights_anon_bytes",
            "rss_mib",
            "pss_mib",
            "engine_start_s",
            "ttft_s",
            "decode_tok_s_1_stream",
            "decode_tok_s_4_streams",
        ):
            fig[f"{key}_vs_bf16"] = fig[key] / base[key] if base[key] else float("nan")
    if as_json:
        print(json.dumps({k: {f: v for f, v in fig.items() if f != "greedy"} for k, fig in figures.items()}, indent=2))
        return 0
    keys = [k for k in base if k != "greedy"]
    print(f"{'figure':34s}" + "".join(f"{('bf16' if s == BASELINE else s):>14s}" for s in figures))
    for key in keys:
        cells = "".join(f"{figures[s][key]:14.3f}" for s in figures)
        print(f"{key:34s}{cells}")
    return 0
