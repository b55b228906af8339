"""The command line and environment of a local vLLM CPU engine, decided in one place.

Flags come from `fleetgate.engine.args.EngineArgs` (the same builder the operator uses), plus
what a laptop needs: prefix caching on, `--enforce-eager` (no torch.compile: start-up in about a
minute), a small `--max-model-len`. Environment for vLLM's CPU backend:
`VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache per engine), `VLLM_CPU_OMP_THREADS_BIND=nobind` with
`OMP_NUM_THREADS` = threads per engine (`EngineConfig.threads_per_engine`: one core per engine is
left to its API server and scheduler; vLLM's `auto` binding would pin every replica's threads to
the same core, so placement is left to the OS), hub access off, usage statistics off.

With `engine.kv_events`, each replica publishes its KV-cache events on `ipc://<log_dir>/engine-<i>.kv` (replay:
`.kv-replay`): ipc sockets, so nothing listens on the network; `EngineSpec.kv_publisher`/`kv_replay` say where.

With `engine.adapters`, LoRA is on: `--enable-lora --max-loras N --max-lora-rank R --lora-modules
name=path ...` (rendered here, after `EngineArgs`' flags) and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, so
adapters can also be loaded and unloaded at runtime (`fleetgate.engine.lora_api`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from fleetgate.engine.args import VLLM_MODULE, EngineArgs, KvEventsArgs
from fleetgate.local.config import EngineConfig
from fleetgate.local.engines import EngineSpec, free_port
from fleetgate.local.schemes import vllm_method


def kv_event_addresses(*, config: EngineConfig, index: int) -> KvEventsArgs | None:
    """Replica `index`'s KV-event sockets: ipc files beside its log (loopback only, nothing on the network)."""
    if not config.kv_events:
        return None
    base = config.log_dir.resolve() / f"engine-{index}"
    return KvEventsArgs(endpoint=f"ipc://{base}.kv", replay_endpoint=f"ipc://{base}.kv-replay", topic="kv")


def engine_args(*, config: EngineConfig, model_path: Path, port: int, kv_events: KvEventsArgs | None = None
                ) -> EngineArgs:
    return EngineArgs(
        model=str(model_path),
        served_model_name=config.model,
        host=config.host,
        port=port,
        dtype=config.dtype,
        # Checkpoints from `prepare-model --quantization` are compressed-tensors ones (GGUF-built ones with a
        # quantized tied embedding: `fleetgate-ct`, the plugin in `fleetgate.local.vllm_plugin`).
        quantization=vllm_method(config.quantization),
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        kv_cache_dtype=config.kv_cache_dtype,
        enable_prefix_caching=True,
        enforce_eager=config.enforce_eager,
        kv_events=kv_events,
        extra_args=tuple(config.extra_args),
    )


def lora_argv(*, config: EngineConfig, adapters: Mapping[str, Path]) -> list[str]:
    """vLLM's LoRA flags for the adapters (name -> PEFT directory); none without adapters."""
    if not adapters:
        return []
    argv = ["--enable-lora", "--max-loras", str(config.lora_slots()), "--max-lora-rank", str(config.max_lora_rank)]
    return [*argv, "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]


def engine_env(*, config: EngineConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    threads = str(config.threads_per_engine())
    env.update(
        {
            # The repo root holds `operator/`, which would shadow the standard library module.
            "PYTHONSAFEPATH": "1",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": threads,
        }
    )
    if config.adapters:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.update(config.env)
    return env


def vllm_specs(
    *, config: EngineConfig, model_path: Path, python: str | None = None, adapters: Mapping[str, Path] | None = None
) -> list[EngineSpec]:
    """One `EngineSpec` per replica; `base_port: 0` picks free loopback ports now. `adapters`: the
    directories of `config.adapters` (`fleetgate.local.up.resolve_adapters`), by name."""
    adapters = adapters or {}
    missing = [a.name for a in config.adapters if a.name not in adapters]
    if missing:
        raise ValueError(f"no directory for adapter(s) {', '.join(missing)}")
    lora = lora_argv(config=config, adapters={a.name: adapters[a.name] for a in config.adapters})
    specs = []
    env = engine_env(config=config)
    for i in range(config.replicas):
        port = config.port_of(i) or free_port(config.host)
        kv = kv_event_addresses(config=config, index=i)
        args = engine_args(config=config, model_path=model_path, port=port, kv_events=kv)
        specs.append(
            EngineSpec(
                name=f"engine-{i}",
                argv=[python or sys.executable, "-m", VLLM_MODULE, *args.to_argv(), *lora],
                env=env,
                url=f"http://{config.host}:{port}",
                log_path=config.log_dir / f"engine-{i}.log",
                expect_model=config.model,
                kv_publisher=kv.endpoint if kv is not None else None,
                kv_replay=kv.replay_endpoint if kv is not None else None,
            )
        )
    return specs
